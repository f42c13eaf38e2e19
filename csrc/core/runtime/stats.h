// What a runtime counts of the ops it ended, for a look from outside the job (status.h, and the
// metrics torch_ddl serves: docs/status.md): per collective and size class the ops, bytes,
// failures and a histogram of their times; failures by kind; per group its last completed op.
// Counting costs a lock and a few stores per op, on the turning thread; reading takes the same
// lock from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../base/clock.h"
#include "../base/status.h"

namespace ddl {

class OpStats {
 public:
  // Upper bounds (seconds) of the time histogram's buckets; one more bucket holds the rest.
  static constexpr std::array<double, 12> kBounds = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3,
                                                     1e-2, 3e-2, 0.1,  0.3,  1.0,  10.0};
  // Size classes by the op's bytes (a rank's share): up to 1 KiB, 64 KiB, 1 MiB, 16 MiB, more.
  static constexpr std::array<uint64_t, 4> kClassBytes = {1ull << 10, 64ull << 10, 1ull << 20,
                                                          16ull << 20};
  static const char* className(int sizeClass);
  static int classOf(uint64_t bytes);

  struct Group {
    std::string name;
    int rank = 0, size = 0;
    uint64_t completed = 0, failed = 0;
    int64_t lastSequence = -1;  // the last op it completed (-1: none yet)
    std::string lastName;
    TimePoint lastEnded;
    std::string lastError;  // the last failure's words (cut at kErrorChars)
    int64_t lastFailedSequence = -1;
  };
  static constexpr size_t kErrorChars = 400;
  struct Counts {
    uint64_t ops = 0, bytes = 0, failed = 0;
    double seconds = 0;
    std::array<uint64_t, kBounds.size() + 1> buckets{};  // not cumulative
  };

  // An op ended (after `seconds` running; ok or with `kind`).
  void ended(uint32_t groupId, const std::string& groupName, int rank, int size,
             const std::string& name, uint32_t sequence, uint64_t bytes, double seconds,
             StatusKind kind, TimePoint now, const std::string& error = "");

  // Of them, allreduces a caller ran on its own thread in one step (group/quick.cc).
  // And those a caller began so but handed to an op (a peer had not come within its spin).
  void countQuick() { quick_.fetch_add(1, std::memory_order_relaxed); }
  void countHanded() { handed_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t quickOps() const { return quick_.load(std::memory_order_relaxed); }
  uint64_t handedOps() const { return handed_.load(std::memory_order_relaxed); }

  // Copies, under the lock.
  std::map<uint32_t, Group> groups() const;
  std::map<std::pair<std::string, int>, Counts> counts() const;  // by (collective, size class)
  std::array<uint64_t, kStatusKinds> failures() const;

  // All of it as JSON: {"ops": [...], "failures": {...}, "groups": [...]}; ages from `now`.
  std::string json(TimePoint now) const;

 private:
  mutable std::mutex mutex_;
  std::map<uint32_t, Group> groups_;
  std::map<std::pair<std::string, int>, Counts> counts_;
  std::array<uint64_t, kStatusKinds> failures_{};
  Group* lastGroup_ = nullptr;
  uint32_t lastGroupId_ = 0;
  Counts* lastCounts_ = nullptr;
  int lastClass_ = -1;
  std::string lastName_;
  std::atomic<uint64_t> quick_{0}, handed_{0};
};

// JSON's string literal of `s` (quotes included).
std::string jsonString(const std::string& s);
// The seconds from `from` to `to`, as the JSON above gives times.
double secondsBetween(TimePoint from, TimePoint to);

}  // namespace ddl
