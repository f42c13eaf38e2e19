// A hash table from a 64-bit tag to a value, in one array (open addressing, linear probing,
// backward-shift deletion): no allocation per entry. The tag matcher keeps its posted receives
// here; every message of a simulated rank inserts a tag and erases it again, and with a node
// per entry (std::unordered_map) that was an allocation and a free per message, a tenth of a
// 65 536-rank simulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ddl {

template <typename V>
class TagTable {
 public:
  size_t size() const { return used_; }
  // The value under `key`, or null. Valid until the next insertion.
  V* find(uint64_t key) {
    if (used_ == 0) return nullptr;
    for (size_t i = home(key);; i = next(i)) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  // The value under `key`, made (V{}) where there is none.
  V& operator[](uint64_t key) {
    if (V* v = find(key)) return *v;
    if (2 * (used_ + 1) > slots_.size()) grow();
    ++used_;
    return place(key, V{});
  }
  // Takes `key` out (nothing where it is not in).
  void erase(uint64_t key) {
    if (used_ == 0) return;
    size_t hole = home(key);
    while (true) {
      if (!slots_[hole].used) return;
      if (slots_[hole].key == key) break;
      hole = next(hole);
    }
    // Later entries of the probe run move back into the hole where their home allows, so
    // that every entry stays reachable from its home without markers of erased ones.
    for (size_t j = next(hole); slots_[j].used; j = next(j)) {
      const size_t h = home(slots_[j].key);
      const bool stays = hole < j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (stays) continue;
      slots_[hole].key = slots_[j].key;
      slots_[hole].value = std::move(slots_[j].value);
      hole = j;
    }
    slots_[hole].used = false;
    slots_[hole].value = V{};
    --used_;
  }

 private:
  struct Slot {
    uint64_t key = 0;
    bool used = false;
    V value{};
  };
  size_t home(uint64_t key) const {
    key ^= key >> 33;  // MurmurHash3's finaliser: tags differ in a few high bits
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return static_cast<size_t>(key) & (slots_.size() - 1);
  }
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }
  // Puts `key` in the first free slot of its probe run (it must not be in the table).
  V& place(uint64_t key, V value) {
    size_t i = home(key);
    while (slots_[i].used) i = next(i);
    slots_[i].used = true;
    slots_[i].key = key;
    slots_[i].value = std::move(value);
    return slots_[i].value;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_ = std::vector<Slot>(old.empty() ? 8 : 2 * old.size());
    for (Slot& s : old) {
      if (s.used) place(s.key, std::move(s.value));
    }
  }
  std::vector<Slot> slots_;  // a power of two in size, at most half used
  size_t used_ = 0;
};

}  // namespace ddl
