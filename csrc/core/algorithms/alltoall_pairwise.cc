// All-to-all with every exchange posted at once. Sends go to r+1, r+2, ... and receives come
// from r-1, r-2, ..., so at each moment the pairs in flight form a permutation and no rank is
// flooded first by everyone. Block sizes may differ per pair (all_to_all_single with splits);
// empty blocks still send an empty message, so both sides agree on what to wait for.
#include <cstring>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task alltoallPairwise(Op& op, const void* in, void* out, AlltoallLayout layout) {
  const int n = op.size();
  const int me = op.rank();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  if (layout.sendBytes[me] > 0) {
    co_await copyInTurns(op, dst + layout.recvOffsets[me], src + layout.sendOffsets[me],
                         layout.sendBytes[me]);
  }
  std::vector<Request*> requests;
  for (int i = 1; i < n; ++i) {
    int from = (me - i + n) % n;
    requests.push_back(
        op.recv(from, tag::slot(0, 0), dst + layout.recvOffsets[from], layout.recvBytes[from]));
  }
  lookUpEveryPeer(op);
  for (int i = 1; i < n; ++i) {
    int to = (me + i) % n;
    requests.push_back(
        op.send(to, tag::slot(0, 0), src + layout.sendOffsets[to], layout.sendBytes[to]));
  }
  co_await op.all(requests);
}

}  // namespace ddl
