// The clock an engine reads for deadlines, wait reports and its housekeeping: the steady clock in
// a real process, virtual time in a simulated one (sim/cluster.h), where one event loop turns
// thousands of engines and a second of virtual time passes as fast as its events run.
#pragma once

#include <chrono>

namespace ddl {

using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
  // std::chrono::steady_clock.
  static const Clock& steady();
};

}  // namespace ddl
