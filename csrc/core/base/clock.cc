#include "clock.h"

namespace ddl {
namespace {

class SteadyClock : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock& Clock::steady() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace ddl
