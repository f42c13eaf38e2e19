// Segmented binomial-tree broadcast.
//
// Ranks are renumbered relative to the root (v = rank - root mod P). Rank v's parent is v with
// its lowest set bit cleared; its children are v + m for the powers of two m below that bit.
// 1. Post receives for every segment of the buffer from the parent (the root has none).
// 2. As segment k arrives (in order), forward it to the children, largest subtree first, so a
//    deep tree streams instead of waiting for whole messages: time ~ (log2 P + segments) hops.
// 3. Finish when every forward has completed.
#include <vector>

#include "../engine/tag.h"
#include "algorithms.h"

namespace ddl {

Task broadcastTree(Op& op, void* data, size_t bytes, int root, PipelineSettings settings) {
  const int n = op.size();
  if (n == 1 || bytes == 0) co_return;
  char* base = static_cast<char*>(data);
  const int v = (op.rank() - root + n) % n;
  int parent = -1;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      parent = (v - mask + root) % n;
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (v + m < n) children.push_back((v + m + root) % n);
  }
  const size_t segment = std::max<size_t>(settings.segmentBytes, 1);
  const size_t segments = (bytes + segment - 1) / segment;
  auto lengthOf = [&](size_t k) { return std::min(segment, bytes - k * segment); };

  std::vector<Request*> arrivals;
  if (parent >= 0) {
    for (size_t k = 0; k < segments; ++k) {
      arrivals.push_back(op.recv(parent, tag::slot(0, 0), base + k * segment, lengthOf(k)));
    }
  }
  std::vector<Request*> forwards;
  for (size_t k = 0; k < segments; ++k) {
    if (parent >= 0) co_await op.all(arrivals[k]);
    for (int child : children) {
      forwards.push_back(op.send(child, tag::slot(0, 0), base + k * segment, lengthOf(k)));
    }
  }
  co_await op.all(forwards);
}

}  // namespace ddl
