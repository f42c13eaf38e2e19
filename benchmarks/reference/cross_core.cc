// Reference: what it costs to move bytes from one core to another through shared memory, the
// bound of every one-host allreduce of medium size (docs/benchmarks.md, "What bounds 64 KiB -
// 1 MiB"). Two processes, each pinned to its core (0 and 1), share a buffer of BYTES. Each round
// process 0 copies its private bytes into the buffer, whose lines process 1 read the round
// before (so each write must first take the line back from the other core), then process 1
// copies the buffer out (each read takes a line the other core wrote). The median round of each
// side, in microseconds and GB/s.
//
//   g++ -std=c++17 -O3 -march=native -o cross_core benchmarks/reference/cross_core.cc
//   cross_core BYTES ITERS   -> "BYTES write_us read_us write_GBps read_GBps"
#include <sched.h>

#include <cstring>

#include "shm_common.h"

namespace {

void pinTo(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const reference::Args a = reference::parse(argc, argv);
  const size_t bytes = std::max<size_t>(a.bytes, 64);
  auto* turns = static_cast<std::atomic<long>*>(reference::sharedRegion(4096));
  new (&turns[0]) std::atomic<long>(0);                  // rounds written
  new (&turns[8]) std::atomic<long>(0);                  // rounds read
  auto* result = reinterpret_cast<double*>(&turns[16]);  // process 1's median read
  char* shared = static_cast<char*>(reference::sharedRegion(bytes));
  std::vector<char> own(bytes, 1);
  std::memset(shared, 0, bytes);
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  pinTo(rank);
  std::vector<double> took;
  for (long round = 0; round < a.iters; ++round) {
    if (rank == 0) {
      reference::waitFor(turns[8], round);
      const double t0 = reference::seconds();
      std::memcpy(shared, own.data(), bytes);
      took.push_back(reference::seconds() - t0);
      turns[0].store(round + 1, std::memory_order_release);
    } else {
      reference::waitFor(turns[0], round + 1);
      const double t0 = reference::seconds();
      std::memcpy(own.data(), shared, bytes);
      took.push_back(reference::seconds() - t0);
      turns[8].store(round + 1, std::memory_order_release);
    }
  }
  if (rank == 1) {
    *result = median(took);
    _exit(own[bytes - 1] == 1 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const double write = median(took), read = *result;
  std::printf("%zu %.2f %.2f %.1f %.1f\n", bytes, write * 1e6, read * 1e6, bytes / write / 1e9,
              bytes / read / 1e9);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
