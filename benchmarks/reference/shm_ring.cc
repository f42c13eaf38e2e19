// Reference: the copy-based ring allreduce of two processes over plain shared memory, no
// library and no kernel copies. Each rank's buffer is private memory (like a torch tensor); data
// crosses through small shared staging slots: rank r copies the chunk its peer reduces into a
// slot, the peer reduces straight from that slot into its buffer and into a second slot, which
// rank r copies into its buffer. Every byte is copied once in user space (the least a copy-based
// scheme needs), so this bounds any library whose tensors are not themselves shared.
//
//   shm_ring BYTES ITERS [ROUNDS]   -> milliseconds per float32 sum allreduce (median round)
#include <cstring>

#include "shm_common.h"

namespace {

constexpr size_t kSegment = 256 << 10;
constexpr long kSlots = 4;

struct Party {
  alignas(64) std::atomic<long> copied{0};    // segments placed in `in`
  alignas(64) std::atomic<long> reduced{0};   // segments placed in `out`
  alignas(64) std::atomic<long> consumed{0};  // peer's `in` segments this party reduced
  alignas(64) std::atomic<long> fetched{0};   // peer's `out` segments this party copied
  alignas(4096) char in[kSlots][kSegment];
  alignas(4096) char out[kSlots][kSegment];
};

// dst += incoming, and the sum also into copy (the slot the peer fetches it from).
void sumInto(float* __restrict dst, float* __restrict copy, const float* __restrict incoming,
             size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float s = dst[i] + incoming[i];
    dst[i] = s;
    copy[i] = s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  reference::Args args = reference::parse(argc, argv);
  return reference::runPair(
      2 * sizeof(Party), [&](int rank, void* shared, reference::Barrier& barrier) {
        auto* parties = static_cast<Party*>(shared);
        if (rank == 0) {
          new (&parties[0]) Party();
          new (&parties[1]) Party();
        }
        barrier.arrive();
        Party& me = parties[rank];
        Party& peer = parties[1 - rank];
        const size_t half = args.bytes / 8 * 4;  // whole floats; the odd tail stays local
        std::vector<float> buffer(args.bytes / 4, rank + 1.0f);
        char* mine = reinterpret_cast<char*>(buffer.data()) + rank * half;
        char* theirs = reinterpret_cast<char*>(buffer.data()) + (1 - rank) * half;
        const long segments = static_cast<long>((half + kSegment - 1) / kSegment);
        auto length = [&](long k) { return std::min(kSegment, half - k * kSegment); };
        long base = 0;
        auto fetch = [&](long k) {
          long g = base + k;
          reference::waitFor(peer.reduced, g + 1);
          std::memcpy(theirs + k * kSegment, peer.out[g % kSlots], length(k));
          me.fetched.store(g + 1, std::memory_order_release);
        };
        auto allreduce = [&] {
          for (long k = 0; k < segments; ++k) {
            long g = base + k;
            reference::waitFor(peer.consumed, g + 1 - kSlots);
            std::memcpy(me.in[g % kSlots], theirs + k * kSegment, length(k));
            me.copied.store(g + 1, std::memory_order_release);
            reference::waitFor(peer.copied, g + 1);
            reference::waitFor(peer.fetched, g + 1 - kSlots);
            auto* dst = reinterpret_cast<float*>(mine + k * kSegment);
            sumInto(dst, reinterpret_cast<float*>(me.out[g % kSlots]),
                    reinterpret_cast<const float*>(peer.in[g % kSlots]), length(k) / 4);
            me.consumed.store(g + 1, std::memory_order_release);
            me.reduced.store(g + 1, std::memory_order_release);
            if (k > 0) fetch(k - 1);
          }
          if (segments > 0) fetch(segments - 1);
          base += segments;
        };
        allreduce();
        reference::expectAll(buffer.data(), 2 * half / 4, 3.0f, rank);
        return reference::timeRounds(args, barrier, allreduce);
      });
}
