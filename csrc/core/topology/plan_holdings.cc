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

// In place. The ranges are disjoint, so one that holds the hole with something on both sides
// of it overlaps no other: it becomes its two sides. Otherwise each range leaves at most one
// piece, in order.
void removeRange(std::vector<Held>& holdings, size_t begin, size_t end) {
  for (size_t i = 0; i < holdings.size(); ++i) {
    const Held h = holdings[i];
    if (h.begin < begin && end < h.end) {
      holdings[i].end = begin;
      holdings.insert(holdings.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                      Held{end, h.end, h.weight});
      return;
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < holdings.size(); ++i) {
    const Held h = holdings[i];
    if (h.end <= begin || end <= h.begin) {
      holdings[kept++] = h;
    } else if (h.begin < begin) {
      holdings[kept++] = Held{h.begin, begin, h.weight};
    } else if (end < h.end) {
      holdings[kept++] = Held{end, h.end, h.weight};
    }
  }
  holdings.resize(kept);
}

void addRange(std::vector<Held>& holdings, Range r, int64_t weight) {
  if (r.length == 0) return;
  holdings.push_back(Held{r.offset, r.offset + r.length, weight});
  std::sort(holdings.begin(), holdings.end(),
            [](const Held& a, const Held& b) { return a.begin < b.begin; });
  size_t merged = 0;
  for (size_t i = 0; i < holdings.size(); ++i) {
    const Held h = holdings[i];
    if (merged > 0 && holdings[merged - 1].end == h.begin &&
        holdings[merged - 1].weight == h.weight) {
      holdings[merged - 1].end = h.end;
    } else {
      holdings[merged++] = h;
    }
  }
  holdings.resize(merged);
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
