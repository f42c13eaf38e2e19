// The ranks of a group made from another's (a shrink's, a split's, a reconfigure's), by new rank:
// rank i of the new group is at(i) of the parent. A shrink's are every rank but the few it leaves
// out, and are held as those: a member holds O(ranks left out), not O(P) (65 536 simulated
// members each holding the list took 17 GB a copy). A split's are listed, in the order given.
#pragma once

#include <algorithm>
#include <vector>

namespace ddl {

class RankSet {
 public:
  // Ranks 0 .. n-1 but `leftOut` (ascending, each below n, none twice).
  static RankSet allBut(int n, std::vector<int> leftOut) {
    RankSet s;
    s.n_ = n;
    s.leftOut_ = std::move(leftOut);
    s.all_ = true;
    return s;
  }
  // These ranks, in this order, each once.
  static RankSet listed(std::vector<int> ranks) {
    RankSet s;
    s.n_ = static_cast<int>(ranks.size());
    s.ascending_ = std::is_sorted(ranks.begin(), ranks.end());
    s.listed_ = std::move(ranks);
    return s;
  }

  int size() const { return all_ ? n_ - static_cast<int>(leftOut_.size()) : n_; }
  // The i-th (0 <= i < size()).
  int at(int i) const {
    if (!all_) return listed_[static_cast<size_t>(i)];
    // leftOut_[k] - k does not decrease: those at most i are the ranks left out below it.
    int low = 0, high = static_cast<int>(leftOut_.size());
    while (low < high) {
      const int mid = (low + high) / 2;
      if (leftOut_[static_cast<size_t>(mid)] - mid <= i) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    return i + low;
  }
  // The place of `rank` (-1: not one of them).
  int indexOf(int rank) const {
    if (!all_) {
      auto it = ascending_ ? std::lower_bound(listed_.begin(), listed_.end(), rank)
                           : std::find(listed_.begin(), listed_.end(), rank);
      return it == listed_.end() || *it != rank ? -1 : static_cast<int>(it - listed_.begin());
    }
    if (rank < 0 || rank >= n_) return -1;
    auto it = std::lower_bound(leftOut_.begin(), leftOut_.end(), rank);
    if (it != leftOut_.end() && *it == rank) return -1;
    return rank - static_cast<int>(it - leftOut_.begin());
  }
  bool contains(int rank) const { return indexOf(rank) >= 0; }
  // Every rank below n() but leftOut() (a shrink's), or listed (a split's).
  bool allButSome() const { return all_; }
  int n() const { return n_; }
  const std::vector<int>& leftOut() const { return leftOut_; }
  // Every one, by place: O(size()), for what walks them all once.
  std::vector<int> list() const {
    if (!all_) return listed_;
    std::vector<int> out;
    out.reserve(static_cast<size_t>(size()));
    size_t k = 0;
    for (int r = 0; r < n_; ++r) {
      if (k < leftOut_.size() && leftOut_[k] == r) {
        ++k;
      } else {
        out.push_back(r);
      }
    }
    return out;
  }

 private:
  RankSet() = default;
  bool all_ = false;
  bool ascending_ = false;  // listed in ascending order: searched by halves
  int n_ = 0;
  std::vector<int> leftOut_;  // all_: ascending
  std::vector<int> listed_;   // otherwise
};

}  // namespace ddl
