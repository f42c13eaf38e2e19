#include "slot_link.h"

#include <algorithm>
#include <atomic>

#include "../base/tag.h"
#include "../shm/shared_ring.h"

namespace ddl {
namespace {

constexpr uint32_t kAbandoned = ~uint32_t{0};  // a notice's step when its sender gave up

}  // namespace

SlotLink::SlotLink(Op& op, SlotWindows& windows, int prev, int next, uint64_t elements,
                   uint32_t phase, uint32_t noticeStep)
    : op_(op),
      windows_(windows),
      prev_(prev),
      next_(next),
      elements_(elements),
      noticeSlot_(tag::slot(phase, noticeStep)),
      freeSlot_(tag::slot(phase, noticeStep + 1)),
      noticeIn_(windows.slots),
      freedIn_(windows.slots) {
  for (size_t s = windows.slots; s-- > 0;) freeSlots_.push_back(static_cast<uint32_t>(s));
}

size_t SlotLink::maxSegmentBytes() const { return windows_.slotBytes; }

void SlotLink::begin(const LinkGeometry& geometry) {
  geometry_ = geometry;
  transfers_ = static_cast<uint64_t>(geometry.steps) * geometry.segments;
}

std::string SlotLink::describeTimeout() const {
  std::string why = "Timed out after " + std::to_string(op_.timeout().count()) + " ms: ";
  if (consumed_ < transfers_ && arrived_.empty()) {
    return why + "no data from rank " + std::to_string(prev_) +
           " (shared-memory ring: " + std::to_string(consumed_) + " of " +
           std::to_string(transfers_) + " slots received)";
  }
  return why + "rank " + std::to_string(next_) + " does not consume its slots (" +
         std::to_string(freedTaken_) + " of " + std::to_string(written_) +
         " written slots given back)";
}

void SlotLink::giveUp(const std::string& why, StatusKind kind) {
  noticesOut_.push_back(SlotNotice{elements_, 0, kAbandoned, 0});
  op_.send(next_, noticeSlot_, &noticesOut_.back(), sizeof(SlotNotice));
  op_.raise(Error(why, kind));
}

void SlotLink::poll() {
  const size_t slots = windows_.slots;
  while (noticesPosted_ < transfers_ && noticeRecvs_.size() < slots) {
    noticeRecvs_.push_back(
        op_.recv(prev_, noticeSlot_, &noticeIn_[noticesPosted_ % slots], sizeof(SlotNotice)));
    ++noticesPosted_;
  }
  while (freedPosted_ < transfers_ && freedRecvs_.size() < slots) {
    freedRecvs_.push_back(op_.recv(next_, freeSlot_, &freedIn_[freedPosted_ % slots], 4));
    ++freedPosted_;
  }
  // Receives of one tag from one sender complete in posting order.
  while (!freedRecvs_.empty() && freedRecvs_.front()->done) {
    uint32_t slot = freedIn_[freedTaken_++ % slots];
    if (slot >= slots) throw Error("rank " + std::to_string(next_) + " freed a slot it never had");
    freeSlots_.push_back(slot);
    freedRecvs_.pop_front();
  }
  while (!noticeRecvs_.empty() && noticeRecvs_.front()->done) {
    SlotNotice m = noticeIn_[noticesTaken_++ % slots];
    noticeRecvs_.pop_front();
    if (m.elements != elements_) {
      giveUp("rank " + std::to_string(prev_) + " allreduces " + std::to_string(m.elements) +
                 " elements, this rank " + std::to_string(elements_) +
                 " (every rank must pass the same shape)",
             StatusKind::kMismatch);
    }
    if (m.step == kAbandoned) {
      giveUp("rank " + std::to_string(prev_) +
                 " abandoned it (the ranks do not all pass the same number of elements)",
             StatusKind::kMismatch);
    }
    if (m.step >= static_cast<uint32_t>(geometry_.steps) || m.segment >= geometry_.segments ||
        m.slot >= slots) {
      giveUp("malformed notice from rank " + std::to_string(prev_), StatusKind::kOther);
    }
    arrived_.push_back(m);
  }
}

bool SlotLink::arrival(Arrival* out) {
  if (arrived_.empty()) return false;
  const SlotNotice& m = arrived_.front();
  std::atomic_thread_fence(std::memory_order_acquire);  // the notice before the slot's bytes
  *out = Arrival{static_cast<int>(m.step), m.segment, windows_.inbox + m.slot * windows_.slotBytes,
                 m.slot};
  arrived_.pop_front();
  return true;
}

char* SlotLink::outbox(char*, size_t, bool fresh) {
  if (freeSlots_.size() < (fresh ? 2u : 1u)) return nullptr;
  uint32_t slot = freeSlots_.back();
  freeSlots_.pop_back();
  return windows_.outbox + slot * windows_.slotBytes;
}

void SlotLink::post(int step, size_t segment, char* at, size_t) {
  const uint32_t slot = static_cast<uint32_t>((at - windows_.outbox) / windows_.slotBytes);
  std::atomic_thread_fence(std::memory_order_release);  // the slot's bytes before the notice
  noticesOut_.push_back(SlotNotice{elements_, segment, static_cast<uint32_t>(step), slot});
  sends_.push_back(op_.send(next_, noticeSlot_, &noticesOut_.back(), sizeof(SlotNotice)));
  ++written_;
}

void SlotLink::release(const Arrival& arrival) {
  freedOut_.push_back(static_cast<uint32_t>(arrival.handle));
  sends_.push_back(op_.send(prev_, freeSlot_, &freedOut_.back(), 4));
  ++consumed_;
}

bool SlotLink::idle() {
  std::erase_if(sends_, [](Request* r) { return r->done; });
  return freedTaken_ == written_ && sends_.empty();
}

Task setUpRingWindows(Op& op, SlotWindows& windows, std::vector<int> order,
                      const PipelineSettings& settings, uint32_t firstStep) {
  co_await setUpSlotWindows(op, windows, std::move(order), settings.segmentBytes,
                            std::max<size_t>(2 * settings.depth, 2), firstStep);
}

}  // namespace ddl
