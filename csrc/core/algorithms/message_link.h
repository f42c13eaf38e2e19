// The message link of a ring pipeline (link.h): segments travel as transport messages.
//
// Sends leave straight from the buffer (outbox returns `home`). Receives of storing steps land in
// place; those of reducing steps land in scratch slots (depth x min(reducing steps, 2)), given
// back when the pipeline has reduced them. At most `depth` receives per step are posted at once.
// All segments of one step share a tag slot (phase, stepBase + step); both sides post them in
// segment order and the transport matches one sender's messages of one slot in send order.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "../engine/op.h"
#include "link.h"

namespace ddl {

class MessageLink : public Link {
 public:
  MessageLink(Op& op, int prev, int next, uint32_t phase, uint32_t stepBase, size_t depth);

  void begin(const LinkGeometry& geometry) override;
  void poll() override {}
  bool expect(int step, size_t segment, char* home, size_t bytes, bool reducing) override;
  bool arrival(Arrival* out) override;
  char* outbox(char* home, size_t, bool) override { return home; }
  void post(int step, size_t segment, char* at, size_t bytes) override;
  void release(const Arrival& arrival) override;
  bool idle() override;

 private:
  struct Posted {
    Request* request;
    size_t segment;
    char* target;
    int slot;  // scratch slot, -1 in place
  };

  Op& op_;
  int prev_;
  int next_;
  uint32_t phase_;
  uint32_t stepBase_;
  size_t depth_;
  size_t slotBytes_ = 0;
  std::vector<std::deque<Posted>> inFlight_;  // by step
  // Steps [lowest_, highest_) may hold posted receives (those below have none): arrival() looks
  // at those only, not at every step of a long ring on every call.
  int lowest_ = 0;
  int highest_ = 0;
  std::shared_ptr<char> scratch_;
  std::vector<int> freeSlots_;
  std::vector<Request*> sends_;
};

}  // namespace ddl
