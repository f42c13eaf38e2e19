// ddl's core alone (as nccl-tests is for NCCL): an allreduce of the Communicator over UCX, with
// no torch and no Python on the path, so that the cost of torch's call is seen apart from ddl's.
// The ranks are forked from one process and meet through a store of files in a fresh directory;
// timed as benchmarks/reference/mpi_allreduce.cc times MPI_Allreduce (in place, float32, sum):
// rounds of ITERS ops between barriers, the median round, as rank 0 sees it after the barrier
// (so the slowest rank's time). The first allreduce's result is checked (exit status 1 if wrong).
//
//   core_bench BYTES ITERS [ROUNDS [RANKS [pin]]]   -> milliseconds per op
//
// Under TORCH_DDL_SHARED_ALLOCATOR=1 the buffer comes from the shared arena, as torch's tensor
// would (from TORCH_DDL_DIRECT_MIN_BYTES), so that the direct allreduce is timed there.
// `pin` pins rank r (and every thread it starts) to core r mod the cores, as Intel MPI pins.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../csrc/core/base/config.h"
#include "../csrc/core/group/communicator.h"
#include "../csrc/core/shm/shared_arena.h"

namespace {

using Clock = std::chrono::steady_clock;

// A store of files in one directory, shared by forked ranks: a value is written to a temporary
// file and renamed into place, so that a reader sees all of it or nothing.
class FileStore : public ddl::KeyValueStore {
 public:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::string& value) override {
    const std::filesystem::path path = pathOf(key);
    const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(getpid());
    std::ofstream(temporary, std::ios::binary) << value;
    std::filesystem::rename(temporary, path);
  }
  std::string get(const std::string& key) override {
    const std::filesystem::path path = pathOf(key);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(path)) {
      if (Clock::now() > deadline) throw ddl::Error("store: no " + key + " after 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream value;
    value << in.rdbuf();
    return value.str();
  }
  int64_t add(const std::string& key, int64_t delta) override {
    const int lock = open((dir_ / "lock").c_str(), O_CREAT | O_RDWR, 0600);
    flock(lock, LOCK_EX);
    const std::filesystem::path path = pathOf(key);
    int64_t sum = delta;
    if (std::filesystem::exists(path)) sum += std::stoll(get(key));
    set(key, std::to_string(sum));
    flock(lock, LOCK_UN);
    close(lock);
    return sum;
  }
  uint64_t nextGroupNumber() override { return static_cast<uint64_t>(add("group_number", 1) - 1); }

 private:
  std::filesystem::path pathOf(std::string key) const {
    std::replace(key.begin(), key.end(), '/', '_');
    return dir_ / key;
  }
  std::filesystem::path dir_;
};

int runRank(int rank, int ranks, const std::filesystem::path& dir, size_t bytes, int iters,
            int rounds, bool pin) {
  if (pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank % static_cast<int>(std::thread::hardware_concurrency()), &set);
    sched_setaffinity(0, sizeof(set), &set);  // before the engine starts its threads
  }
  auto store = std::make_shared<FileStore>(dir);
  ddl::Engine& engine = ddl::Engine::process();
  auto comm = ddl::Communicator::create(engine, store, rank, ranks, std::chrono::seconds(60));
  const size_t count = bytes / 4;
  std::vector<float> ordinary;
  float* buffer = nullptr;
  // As torch allocates: from the shared arena under TORCH_DDL_SHARED_ALLOCATOR=1, from the
  // smallest size it serves (csrc/torch/shared_allocator.cpp), else ordinary memory.
  const ddl::Config& settings = ddl::config();
  if (settings.sharedAllocator &&
      count * 4 >= std::max(settings.directMinBytes, ddl::SharedArena::kPage)) {
    buffer = static_cast<float*>(ddl::SharedArena::process().allocate(count * 4));
  }
  if (buffer == nullptr) {
    ordinary.resize(std::max<size_t>(count, 1));
    buffer = ordinary.data();
  }
  std::fill(buffer, buffer + count, 1.0f);
  ddl::CallOptions waited;  // each call is waited for at once, as a blocking torch call is
  waited.waited = true;
  auto allreduce = [&] {
    auto work =
        comm->allreduce(buffer, count, ddl::DataType::kFloat32, ddl::ReduceOp::kSum, waited);
    work->wait();
    if (work->failed()) throw ddl::Error(work->error());
  };
  auto barrier = [&] {
    auto work = comm->barrier(waited);
    work->wait();
    if (work->failed()) throw ddl::Error(work->error());
  };
  allreduce();
  for (size_t i = 0; i < count; ++i) {
    if (buffer[i] != static_cast<float>(ranks)) {
      throw ddl::Error("element " + std::to_string(i) + " is " + std::to_string(buffer[i]) +
                       " after the first allreduce of ones, not " + std::to_string(ranks));
    }
  }
  std::vector<double> perOp;
  for (int r = 0; r < rounds; ++r) {
    barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) allreduce();
    barrier();
    perOp.push_back(std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  std::sort(perOp.begin(), perOp.end());
  if (rank == 0) std::printf("%.6f\n", perOp[perOp.size() / 2] * 1e3);
  std::fflush(stdout);
  comm.reset();
  ddl::Engine::shutdownProcess();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BYTES ITERS [ROUNDS [RANKS [pin]]]\n", argv[0]);
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const int iters = std::max(1, std::atoi(argv[2]));
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  const int ranks = argc > 4 ? std::max(1, std::atoi(argv[4])) : 2;
  const bool pin = argc > 5 && std::string(argv[5]) == "pin";
  char pattern[] = "/tmp/ddl_core_bench.XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::filesystem::path dir = pattern;
  std::vector<pid_t> children;
  const pid_t parent = getpid();
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a benchmark killed (a test's timeout) takes its ranks
      if (getppid() != parent) std::_Exit(1);  // it died before that was set
      int status = 1;
      try {
        status = runRank(r, ranks, dir, bytes, iters, rounds, pin);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::_Exit(status);
    }
    children.push_back(pid);
  }
  // A rank that fails leaves the others waiting for it: they are stopped at once.
  int failed = 0;
  while (!children.empty()) {
    int status = 0;
    const pid_t pid = wait(&status);
    if (pid < 0) break;
    std::erase(children, pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (failed++ == 0) {
        for (pid_t child : children) kill(child, SIGKILL);  // not yet reaped: still theirs
      }
    }
  }
  std::filesystem::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
