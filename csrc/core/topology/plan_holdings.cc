#include "plan_holdings.h"

#include <algorithm>
#include <string>

#include "../base/types.h"

namespace ddl {

Holdings initialHoldings(int size, Range range) {
  Holdings h(size);
  if (range.length > 0) {
    for (auto& v : h) v.push_back(Held{range.offset, range.offset + range.length, 1});
  }
  return h;
}

int64_t weightOver(const std::vector<Held>& holdings, size_t begin, size_t end) {
  for (const Held& h : holdings) {
    if (h.begin <= begin && end <= h.end) return h.weight;
  }
  return -1;
}

void removeRange(std::vector<Held>& holdings, size_t begin, size_t end) {
  std::vector<Held> out;
  for (const Held& h : holdings) {
    if (h.end <= begin || end <= h.begin) {
      out.push_back(h);
      continue;
    }
    if (h.begin < begin) out.push_back(Held{h.begin, begin, h.weight});
    if (end < h.end) out.push_back(Held{end, h.end, h.weight});
  }
  holdings = std::move(out);
}

void addRange(std::vector<Held>& holdings, Range r, int64_t weight) {
  if (r.length == 0) return;
  holdings.push_back(Held{r.offset, r.offset + r.length, weight});
  std::sort(holdings.begin(), holdings.end(),
            [](const Held& a, const Held& b) { return a.begin < b.begin; });
  std::vector<Held> merged;
  for (const Held& h : holdings) {
    if (!merged.empty() && merged.back().end == h.begin && merged.back().weight == h.weight) {
      merged.back().end = h.end;
    } else {
      merged.push_back(h);
    }
  }
  holdings = std::move(merged);
}

void applyRing(Holdings& holdings, const StageRing& ring) {
  const size_t begin = ring.chunks.front().offset;
  const size_t end = ring.chunks.back().offset + ring.chunks.back().length;
  int64_t sum = 0;
  for (int rank : ring.order) {
    int64_t w = weightOver(holdings[rank], begin, end);
    if (w < 0) {
      throw Error("ddl: plan has rank " + std::to_string(rank) + " reduce elements [" +
                  std::to_string(begin) + ", " + std::to_string(end) + ") it does not hold");
    }
    sum += w;
    removeRange(holdings[rank], begin, end);
  }
  for (size_t p = 0; p < ring.order.size(); ++p)
    addRange(holdings[ring.order[p]], ring.chunks[p], sum);
}

}  // namespace ddl
