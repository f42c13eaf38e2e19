// A first-in first-out queue that costs nothing while empty: a vector and the index of its
// front. libstdc++'s std::deque allocates a map and a 512-byte node as soon as it is made, which
// is most of the memory of a rank that keeps hundreds of short queues (posted receives by tag,
// arrivals waiting by tag: a simulated rank of a large group holds thousands of them).
#pragma once

#include <cstddef>
#include <vector>

namespace ddl {

template <typename T>
class Fifo {
 public:
  using iterator = typename std::vector<T>::iterator;

  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  const T& front() const { return items_[head_]; }
  T& front() { return items_[head_]; }
  iterator begin() { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  iterator end() { return items_.end(); }
  void push_back(const T& item) { items_.push_back(item); }
  void pop_front() {
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= kCompactAt && 2 * head_ >= items_.size()) {  // taken more than it holds
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  // Takes out the item at `it` (order kept); the iterator to the one after it.
  iterator erase(iterator it) {
    if (it == begin()) {
      pop_front();
      return begin();
    }
    return items_.erase(it);
  }
  void clear() {
    items_.clear();
    head_ = 0;
  }

 private:
  static constexpr size_t kCompactAt = 32;
  std::vector<T> items_;
  size_t head_ = 0;
};

}  // namespace ddl
