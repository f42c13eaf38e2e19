// Shared pieces of the library-free reference allreduces (two processes, fork, shared memory).
// They bound what any library can do on this machine; allreduce_bench.py --reference runs them.
#pragma once

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace reference {

inline double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void* sharedRegion(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return p;
}

// Spins until value >= at_least; a peer that stops (crashed, or failed its check) ends this
// process after 60 s instead of hanging it.
inline void waitFor(const std::atomic<long>& value, long at_least) {
  double deadline = 0;
  for (unsigned spins = 1; value.load(std::memory_order_acquire) < at_least; ++spins) {
    __builtin_ia32_pause();
    if (spins % 4096 == 0) {
      double now = seconds();
      if (deadline == 0) deadline = now + 60;
      if (now > deadline) {
        std::fprintf(stderr, "the other process made no progress for 60 s\n");
        std::exit(1);
      }
    }
  }
}

// A two-party barrier on a shared counter: call number k returns once both parties made it.
class Barrier {
 public:
  explicit Barrier(std::atomic<long>* counter) : counter_(counter) {}
  void arrive() {
    ++calls_;
    counter_->fetch_add(1, std::memory_order_acq_rel);
    waitFor(*counter_, 2 * calls_);
  }

 private:
  std::atomic<long>* counter_;
  long calls_ = 0;
};

struct Args {
  size_t bytes = 0;
  int iters = 1;
  int rounds = 5;
};

inline Args parse(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BYTES ITERS [ROUNDS]\n", argv[0]);
    std::exit(2);
  }
  Args a;
  a.bytes = std::strtoull(argv[1], nullptr, 10) / 4 * 4;
  a.iters = std::max(1, std::atoi(argv[2]));
  if (argc > 3) a.rounds = std::max(1, std::atoi(argv[3]));
  return a;
}

// Runs `body(rank, barrier)` in two processes; body returns rank 0's median seconds per op,
// which is printed in milliseconds. Exit status is non-zero if the child fails.
template <typename Body>
int runPair(size_t sharedBytes, Body body) {
  auto* counter = static_cast<std::atomic<long>*>(sharedRegion(4096));
  new (counter) std::atomic<long>(0);
  void* shared = sharedRegion(std::max<size_t>(sharedBytes, 4096));
  pid_t child = fork();
  int rank = child == 0 ? 1 : 0;
  Barrier barrier(counter);
  double perOp = body(rank, shared, barrier);
  if (rank == 1) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("%.6f\n", perOp * 1e3);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

// Exits with a message unless every element is `expected` (the first allreduce's result).
inline void expectAll(const float* data, size_t n, float expected, int rank) {
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != expected) {
      std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, data[i], expected);
      std::exit(1);
    }
  }
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over args.rounds of the seconds per allreduce() call, args.iters calls per round, both
// processes starting each round together.
template <typename Allreduce>
double timeRounds(const Args& args, Barrier& barrier, Allreduce& allreduce) {
  std::vector<double> rounds;
  for (int r = 0; r < args.rounds; ++r) {
    barrier.arrive();
    double t0 = seconds();
    for (int i = 0; i < args.iters; ++i) allreduce();
    barrier.arrive();
    rounds.push_back((seconds() - t0) / args.iters);
  }
  return median(rounds);
}

}  // namespace reference
