// Segmented tree broadcast over the tree the topology gives (block_plan.h): binomial over all
// ranks relative to the root or, across hosts, binomial among one leader per host and then
// within each host, so the data enters each host once.
// 1. Post receives for every segment of the buffer from the parent (the root has none).
// 2. As segment k arrives (in order), forward it to the children, largest subtree first, so a
//    deep tree streams instead of waiting for whole messages: time ~ (log2 P + segments) hops.
// 3. Finish when every forward has completed.
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task broadcastTree(Op& op, void* data, size_t bytes, TreePlace place, PipelineSettings settings) {
  if (op.size() == 1 || bytes == 0) co_return;
  char* base = static_cast<char*>(data);
  const int parent = place.parent;
  const std::vector<int>& children = place.children;
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
