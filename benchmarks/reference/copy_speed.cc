// Reference: how fast one core copies another process's memory with the kernel (CMA,
// process_vm_readv, what UCX uses for large same-host messages) and with a user-space memcpy.
// CMA reads BYTES of a child process's private buffer, memcpy as many of this process's own, in
// 256 KiB pieces into one 256 KiB buffer (as a pipelined receive does), ROUNDS times.
//
//   copy_speed BYTES [ROUNDS]   -> "cma GB/s" and "memcpy GB/s" lines
#include <sys/uio.h>

#include <csignal>
#include <cstring>

#include "shm_common.h"

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (64 << 20);
  int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  constexpr size_t kPiece = 256 << 10;
  bytes = std::max(bytes / kPiece, size_t{1}) * kPiece;
  std::vector<char> source(bytes, 1);
  std::vector<char> target(kPiece);
  pid_t child = fork();
  if (child == 0) {
    // The child keeps its copy of `source` (written here, so no longer shared with the parent).
    std::memset(source.data(), 2, bytes);
    pause();
    _exit(0);
  }
  usleep(200 * 1000);
  auto measure = [&](bool cma) {
    double t0 = reference::seconds();
    for (int r = 0; r < rounds; ++r) {
      for (size_t offset = 0; offset < bytes; offset += kPiece) {
        if (cma) {
          iovec local{target.data(), kPiece};
          iovec remote{source.data() + offset, kPiece};
          if (process_vm_readv(child, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(kPiece)) {
            std::perror("process_vm_readv");
            kill(child, SIGKILL);
            std::exit(1);
          }
        } else {
          std::memcpy(target.data(), source.data() + offset, kPiece);
        }
      }
    }
    return static_cast<double>(bytes) * rounds / (reference::seconds() - t0) / 1e9;
  };
  double cma = measure(true);
  bool fromChild = target[0] == 2;
  double user = measure(false);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (!fromChild) {
    std::fprintf(stderr, "process_vm_readv did not return the child's bytes\n");
    return 1;
  }
  std::printf("cma GB/s %.2f\nmemcpy GB/s %.2f\n", cma, user);
  return 0;
}
