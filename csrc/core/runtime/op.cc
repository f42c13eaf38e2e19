#include "op.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "../base/tag.h"
#include "runtime.h"

namespace ddl {

Op::Op(std::shared_ptr<const Group> group, uint32_t sequence, std::string name,
       std::chrono::milliseconds timeout, std::shared_ptr<Work> work)
    : work(std::move(work)),
      group_(std::move(group)),
      sequence_(sequence),
      name_(std::move(name)),
      timeout_(timeout) {
  group_->opsAlive.n.fetch_add(1, std::memory_order_relaxed);
}

Op::~Op() {
  task = Task();  // the coroutine frame first: its locals may point at this op's requests
  group_->opsAlive.n.fetch_sub(1, std::memory_order_release);
}

Request* Op::newRequest(int peer, bool isSend) {
  Request* req;
  if (!recycled_.empty()) {
    req = recycled_.back();
    recycled_.pop_back();
    *req = Request{};
  } else {
    if (requests_.empty()) requests_.reserve(4);  // most ops post a few: one allocation
    requests_.push_back(std::make_unique<Request>());
    req = requests_.back().get();
  }
  req->peer = peer;
  req->isSend = isSend;
  req->owner = this;
  req->observer = &Op::observe;
  return req;
}

bool Op::refuseAfterFailure(Request* req) {
  // Nothing more leaves a failed op (a receive may complete inside the call that posts it, and
  // the algorithm runs on until its next co_await): a peer must not get data built on it.
  if (failure_.ok()) return false;
  req->fail(StatusKind::kCancelled, "not posted: the op had already failed");
  return true;
}

void Op::observe(Request* req) {
  Op* op = static_cast<Op*>(req->owner);
  if (op == nullptr) return;
  ++op->completions_;
  if (req->consumer != nullptr) req->consumer(req->consumerContext);
  if (!op->failure_.ok()) return;
  // For failures only: the peer's words and the ranks the failure names.
  auto rank = [req] { return "rank " + std::to_string(req->peer); };
  auto peer = [req] { return std::vector<int>{req->peer}; };
  if (req->isCallPrint && !req->isSend && !req->failed()) {
    Status verdict = op->callCheck_.verdict(*req);
    if (!verdict.ok()) op->failure_ = std::move(verdict);
    return;
  }
  auto disagree = [op] {  // for failures only
    return ": the ranks called " + op->name_ + " with different sizes or dtypes";
  };
  const bool sized = !req->isSend && req->expectedBytes != Request::kAnySize;
  if (req->failed() && sized && req->status.kind == StatusKind::kTruncated) {
    op->failure_ = Status(StatusKind::kMismatch,
                          rank() + " sent more than the " + std::to_string(req->expectedBytes) +
                              " bytes this rank expects" + disagree(),
                          peer());
  } else if (req->failed()) {
    const StatusKind kind =
        req->status.kind == StatusKind::kTruncated ? StatusKind::kMismatch : req->status.kind;
    const std::string what = std::string(req->isSend ? "send to" : "receive from") + " rank " +
                             std::to_string(req->peer) + " failed: " + req->status.detail;
    // A peer the transport found gone reads as the heartbeats' news of it does, whichever
    // transport carried the message (TCP's reset, a shared-memory peer's death).
    op->failure_ =
        Status(kind, kind == StatusKind::kPeerLost ? rank() + " is gone: " + what : what, peer());
  } else if (sized && req->receivedBytes != req->expectedBytes) {
    op->failure_ = Status(StatusKind::kMismatch,
                          rank() + " sent " + std::to_string(req->receivedBytes) +
                              " bytes where this rank expects " +
                              std::to_string(req->expectedBytes) + disagree(),
                          peer());
  }
}

Request* Op::send(int peer, uint64_t slot, const void* data, size_t bytes) {
  callCheck_.beforeSend(peer);
  return postSend(newRequest(peer, true), sequence_, slot, data, bytes);
}

Request* Op::sendUnder(uint32_t sequence, int peer, uint64_t slot, const void* data, size_t bytes) {
  return postSend(newRequest(peer, true), sequence, slot, data, bytes);
}

Request* Op::recvUnder(uint32_t sequence, int peer, uint64_t slot, void* data, size_t bytes) {
  Request* req = newRequest(peer, false);
  req->expectedBytes = Request::kAnySize;
  return postReceive(req, sequence, slot, data, bytes);
}

Request* Op::postSend(Request* req, uint32_t sequence, uint64_t slot, const void* data,
                      size_t bytes) {
  PeerId peer;
  if (!ready(req, &peer)) return req;
  uint64_t t = tag::make(group_->id, sequence, slot, static_cast<uint32_t>(group_->rank));
  group_->runtime->transport().send(peer, t, data, bytes, req);
  return req;
}

bool Op::ready(Request* req, PeerId* id) {
  if (refuseAfterFailure(req)) return false;
  try {
    *id = group_->peer(req->peer);
    return true;
  } catch (const Error& e) {  // no endpoint can be made: fails as a request to a lost peer
    req->fail(StatusKind::kPeerLost, std::string("peer unreachable: ") + e.what());
    return false;
  }
}

Request* Op::put(int peer, uint64_t remote, size_t offset, const void* data, size_t bytes) {
  Request* req = newRequest(peer, true);
  PeerId id;
  if (ready(req, &id)) group_->runtime->transport().put(id, remote, offset, data, bytes, req);
  return req;
}

Request* Op::flush(int peer) {
  Request* req = newRequest(peer, true);
  PeerId id;
  if (ready(req, &id)) group_->runtime->transport().flush(id, req);
  return req;
}

Request* Op::recv(int peer, uint64_t slot, void* data, size_t bytes) {
  return recvExpecting(peer, slot, data, bytes, bytes);
}

Request* Op::recvUpTo(int peer, uint64_t slot, void* data, size_t bytes) {
  return recvExpecting(peer, slot, data, bytes, Request::kAnySize);
}

Request* Op::recvExpecting(int peer, uint64_t slot, void* data, size_t bytes, size_t expected) {
  callCheck_.beforeReceive(peer);
  Request* req = newRequest(peer, false);
  req->expectedBytes = expected;  // before posting: the transport may complete it at once
  return postReceive(req, sequence_, slot, data, bytes);
}

Request* Op::postReceive(Request* req, uint32_t sequence, uint64_t slot, void* data, size_t bytes) {
  if (refuseAfterFailure(req)) return req;
  uint64_t t = tag::make(group_->id, sequence, slot, static_cast<uint32_t>(req->peer));
  group_->runtime->transport().recv(t, tag::kMatchAll, data, bytes, req);
  return req;
}

Request* Op::recvAny(uint64_t slot, void* data, size_t bytes) {
  Request* req = newRequest(-1, false);
  uint64_t t = tag::make(group_->id, sequence_, slot, 0);
  group_->runtime->transport().recv(t, tag::anySource(tag::wideBits(group_->size)), data, bytes,
                                    req);
  return req;
}

int Op::sourceOf(const Request* request) const {
  return static_cast<int>(tag::source(request->senderTag, group_->id));
}

void Op::Until::await_suspend(std::coroutine_handle<> handle) {
  op_->waiting_ = this;
  op_->resumePoint_ = handle;
  op_->checked_ = op_->completions_;
}

Op::Until Op::all(std::vector<Request*> requests) {
  return until([requests = std::move(requests)] {
    for (Request* r : requests) {
      if (!r->done) return false;
    }
    return true;
  });
}

Op::Until Op::next() {
  if (std::exchange(turnGivenUp_, false)) return yieldTurn();
  return until([this] { return completions_ != seen_; });
}

bool Op::turnDue() const { return group_->runtime->clock().now() - resumedAt_ >= kTurnSlice; }

Op::Until Op::poll(std::function<bool()> predicate, std::chrono::nanoseconds spin) {
  pollSpinsUntil_ = group_->runtime->clock().now() + spin;
  return Until(this, std::move(predicate), true);
}

Op::Until Op::yieldTurn() {
  wakeAt(group_->runtime->clock().now());
  auto asked = std::make_shared<bool>(false);
  return until([asked] { return std::exchange(*asked, true); });
}

void Op::recycle(Request* req) {
  if (req == nullptr || !req->done) return;
  if (req->isSend && req->peer >= 0) recycledSentTo_.insert(req->peer);
  req->consumer = nullptr;
  req->isSend = false;  // counted in recycledSentTo_ now
  req->peer = -1;
  recycled_.push_back(req);
}

std::set<int> Op::sentTo() const {
  std::set<int> to = recycledSentTo_;
  for (const auto& r : requests_) {
    if (r->isSend && r->peer >= 0) to.insert(r->peer);
  }
  return to;
}

std::vector<std::unique_ptr<Request>> Op::takePending() {
  std::vector<std::unique_ptr<Request>> pending;
  for (auto& r : requests_) {
    if (!r->done) {
      r->owner = nullptr;
      pending.push_back(std::move(r));
    }
  }
  return pending;
}

}  // namespace ddl
