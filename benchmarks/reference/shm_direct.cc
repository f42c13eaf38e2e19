// Reference: zero-copy allreduce of two processes whose buffers both live in shared memory. Rank r
// sums its half of the two buffers and stores the sum into both: no copies at all. What a
// single-copy-free mechanism (XPMEM-style mapping of the peer's memory, which this kernel does not
// offer; CMA always copies) would allow; not reachable for private torch tensors.
//
//   shm_direct BYTES ITERS [ROUNDS]   -> milliseconds per float32 sum allreduce (median round)
#include "shm_common.h"

int main(int argc, char** argv) {
  reference::Args args = reference::parse(argc, argv);
  return reference::runPair(
      2 * args.bytes, [&](int rank, void* shared, reference::Barrier& barrier) {
        const size_t n = args.bytes / 4;
        float* mine = static_cast<float*>(shared) + rank * n;
        float* theirs = static_cast<float*>(shared) + (1 - rank) * n;
        for (size_t i = 0; i < n; ++i) mine[i] = rank + 1.0f;
        const size_t begin = rank * (n / 2);
        const size_t end = rank == 0 ? n / 2 : n;
        auto allreduce = [&] {
          barrier.arrive();  // the peer has finished writing the previous result into my buffer
          for (size_t i = begin; i < end; ++i) {
            float s = mine[i] + theirs[i];
            mine[i] = s;
            theirs[i] = s;
          }
        };
        allreduce();
        barrier.arrive();
        reference::expectAll(mine, n, 3.0f, rank);
        return reference::timeRounds(args, barrier, allreduce);
      });
}
