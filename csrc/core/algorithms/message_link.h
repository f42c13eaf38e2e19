// The message link of a ring pipeline (link.h): segments travel as transport messages.
//
// Sends leave straight from the buffer (outbox returns `home`). Receives of storing steps land in
// place; those of reducing steps land in scratch slots (depth x min(reducing steps, 2)), given
// back when the pipeline has reduced them. At most `depth` receives per step are posted at once.
// All segments of one step share a tag slot (phase, stepBase + step); both sides post them in
// segment order and the transport matches one sender's messages of one slot in send order.
#pragma once

#include <memory>
#include <vector>

#include "../base/fifo.h"
#include "../runtime/op.h"
#include "link.h"

namespace ddl {

class MessageLink : public Link {
 public:
  MessageLink(Op& op, int prev, int next, uint32_t phase, uint32_t stepBase, size_t depth);
  ~MessageLink() override;  // requests still posted (a failed op) stop telling it

  void begin(const LinkGeometry& geometry) override;
  void poll() override {}
  bool expect(int step, size_t segment, char* home, size_t bytes, bool reducing) override;
  bool reducingRoom() const override { return !freeSlots_.empty(); }
  bool arrival(Arrival* out) override;
  char* outbox(char* home, size_t, bool) override { return home; }
  void post(int step, size_t segment, char* at, size_t bytes) override;
  void release(const Arrival& arrival) override;
  bool idle() override;
  const int64_t* activity() const override { return activity_; }
  bool countInto(int64_t* counter) override {
    *counter = *activity_;
    activity_ = counter;
    return true;
  }

 private:
  struct Posted {
    Request* request;
    size_t segment;
    char* target;
    int slot;  // scratch slot, -1 in place
  };
  using StepQueue = Fifo<Posted>;  // the receives posted for one step, oldest first
  StepQueue& queueOf(int step) { return inFlight_[static_cast<size_t>(step) % inFlight_.size()]; }
  void reap();  // gives back the sends that have left

  Op& op_;
  int prev_;
  int next_;
  uint32_t phase_;
  uint32_t stepBase_;
  size_t depth_;
  size_t slotBytes_ = 0;
  // By step modulo the pipeline's window (LinkGeometry::window): the steps that hold posted
  // receives lie within one window, [lowest_, highest_), lowest_ the lowest of them, and
  // arrival() looks at those only.
  std::vector<StepQueue> inFlight_;
  int lowest_ = 0;
  int highest_ = 0;
  size_t ready_ = 0;         // posted receives completed and not yet handed over by arrival()
  int64_t ownActivity_ = 0;  // receives and sends completed after they were posted
  int64_t* activity_ = &ownActivity_;  // where they are counted
  std::shared_ptr<char> scratch_;
  std::vector<int> freeSlots_;
  std::vector<Request*> sends_;
  size_t reapAt_ = 64;  // sends_ is trimmed of what has left as it grows to this
};

}  // namespace ddl
