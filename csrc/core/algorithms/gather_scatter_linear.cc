// Linear gather and scatter: the root posts one receive (gather) or one send (scatter) per rank,
// all at once, and every other rank exchanges its single block with the root. One round; the
// root's link carries (P-1) blocks, which is the minimum for these collectives.
#include <cstring>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task gatherLinear(Op& op, const void* in, void* out, size_t bytes, int root) {
  const int n = op.size();
  if (op.rank() != root) {
    if (bytes > 0) co_await op.all(op.send(root, tag::slot(0, 0), in, bytes));
    co_return;
  }
  char* base = static_cast<char*>(out);
  if (bytes > 0 && base + root * bytes != in) {
    co_await copyInTurns(op, base + root * bytes, in, bytes);
  }
  if (bytes == 0) co_return;
  std::vector<Request*> arrivals;
  for (int r = 0; r < n; ++r) {
    if (r != root) arrivals.push_back(op.recv(r, tag::slot(0, 0), base + r * bytes, bytes));
  }
  co_await op.all(arrivals);
}

Task scatterLinear(Op& op, const void* in, void* out, size_t bytes, int root) {
  const int n = op.size();
  if (op.rank() != root) {
    if (bytes > 0) co_await op.all(op.recv(root, tag::slot(0, 0), out, bytes));
    co_return;
  }
  const char* base = static_cast<const char*>(in);
  if (bytes > 0 && out != base + root * bytes) {
    co_await copyInTurns(op, out, base + root * bytes, bytes);
  }
  if (bytes == 0) co_return;
  lookUpEveryPeer(op);
  std::vector<Request*> departures;
  for (int r = 0; r < n; ++r) {
    if (r != root) departures.push_back(op.send(r, tag::slot(0, 0), base + r * bytes, bytes));
  }
  co_await op.all(departures);
}

}  // namespace ddl
