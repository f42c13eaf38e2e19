#include "op.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "../base/tag.h"
#include "runtime.h"

namespace ddl {
namespace {

constexpr uint64_t kPrintSlot = tag::slot(tag::kControlPhase, tag::kPrintStep);

}  // namespace

void GroupState::recordFailure(const Status& status, bool remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_.status.ok()) return;
  first_ = Failure{status, remote};
}

GroupState::Failure GroupState::firstFailure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_;
}

void GroupState::close(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (refusal_.ok()) refusal_ = reason;
}

void GroupState::fail(const Status& status, bool remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_.status.ok()) first_ = Failure{status, remote};
  if (refusal_.ok()) refusal_ = status.withDetail("the group failed earlier: " + status.detail);
}

void GroupState::noteGone(int rank, TimePoint when) {
  std::lock_guard<std::mutex> lock(mutex_);
  gone_.emplace(rank, when);
}

std::vector<int> GroupState::gone() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> ranks;
  for (const auto& [rank, when] : gone_) ranks.push_back(rank);
  return ranks;
}

std::optional<TimePoint> GroupState::goneSince(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = gone_.find(rank);
  if (it == gone_.end()) return std::nullopt;
  return it->second;
}

Status GroupState::refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusal_;
}

PeerId Group::peer(int r) const {
  PeerId& id = peers.at(static_cast<size_t>(r));
  if (id < 0) id = runtime->connect(addresses.at(static_cast<size_t>(r)));
  return id;
}

Op::Op(std::shared_ptr<const Group> group, uint32_t sequence, std::string name,
       std::chrono::milliseconds timeout, std::shared_ptr<Work> work)
    : work(std::move(work)),
      group_(std::move(group)),
      sequence_(sequence),
      name_(std::move(name)),
      timeout_(timeout) {}

Op::~Op() {
  task = Task();  // the coroutine frame first: its locals may point at this op's requests
}

Request* Op::newRequest(int peer, bool isSend) {
  Request* req;
  if (!recycled_.empty()) {
    req = recycled_.back();
    recycled_.pop_back();
    *req = Request{};
  } else {
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
    const PrintIn* in = op->printIn(req->peer);
    CallPrint theirs;
    if (in != nullptr && req->receivedBytes >= sizeof(CallPrint)) {
      std::memcpy(&theirs, in->bytes, sizeof(theirs));
    }
    if (in == nullptr || req->receivedBytes < sizeof(CallPrint) ||
        theirs.magic != CallPrint::kMagic) {
      op->failure_ = Status(StatusKind::kOther, rank() + " sent a malformed call check", peer());
    } else if (!(theirs == op->print_)) {
      std::string words = "the ranks' calls differ: " + rank() + " called " + theirs.describe() +
                          ", rank " + std::to_string(op->rank()) + " called " +
                          op->print_.describe();
      if (theirs.sequence != op->print_.sequence) {
        words += " (as op #" + std::to_string(theirs.sequence) + ")";
      }
      op->failure_ = Status(StatusKind::kMismatch, std::move(words), peer());
    } else if (op->inlined() && req->receivedBytes != sizeof(CallPrint) + op->inlineBytes_) {
      op->failure_ = Status(StatusKind::kMismatch,
                            rank() + "'s call check carried " +
                                std::to_string(req->receivedBytes - sizeof(CallPrint)) +
                                " bytes of data where this rank expects " +
                                std::to_string(op->inlineBytes_) + " (the ranks' settings differ)",
                            peer());
    }
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
  if (callCheckStarted_) sendPrint(peer);
  return postSend(newRequest(peer, true), slot, data, bytes);
}

Request* Op::postSend(Request* req, uint64_t slot, const void* data, size_t bytes) {
  return postSendUnder(sequence_, req, slot, data, bytes);
}

Request* Op::sendUnder(uint32_t sequence, int peer, uint64_t slot, const void* data, size_t bytes) {
  return postSendUnder(sequence, newRequest(peer, true), slot, data, bytes);
}

Request* Op::recvUnder(uint32_t sequence, int peer, uint64_t slot, void* data, size_t bytes) {
  Request* req = newRequest(peer, false);
  req->expectedBytes = Request::kAnySize;
  return postReceiveUnder(sequence, req, slot, data, bytes);
}

Request* Op::postSendUnder(uint32_t sequence, Request* req, uint64_t slot, const void* data,
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
  return postRecv(peer, slot, data, bytes, bytes);
}

Request* Op::recvUpTo(int peer, uint64_t slot, void* data, size_t bytes) {
  return postRecv(peer, slot, data, bytes, Request::kAnySize);
}

Request* Op::postRecv(int peer, uint64_t slot, void* data, size_t bytes, size_t expected) {
  if (callCheckStarted_) askPrint(peer);
  Request* req = newRequest(peer, false);
  req->expectedBytes = expected;  // before posting: the transport may complete it at once
  return postReceive(req, slot, data, bytes);
}

Request* Op::postReceive(Request* req, uint64_t slot, void* data, size_t bytes) {
  return postReceiveUnder(sequence_, req, slot, data, bytes);
}

Request* Op::postReceiveUnder(uint32_t sequence, Request* req, uint64_t slot, void* data,
                              size_t bytes) {
  if (refuseAfterFailure(req)) return req;
  uint64_t t = tag::make(group_->id, sequence, slot, static_cast<uint32_t>(req->peer));
  group_->runtime->transport().recv(t, tag::kMatchAll, data, bytes, req);
  return req;
}

void Op::setPrint(const CallPrint& print) {
  print_ = print;
  print_.sequence = sequence_;
}

void Op::setInline(const void* data, size_t bytes) {
  inlineData_ = data;
  inlineBytes_ = bytes <= kInlineMax ? bytes : 0;
}

const Op::PrintIn* Op::printIn(int peer) const {
  if (!printsInByPeer_.empty()) {
    auto it = printsInByPeer_.find(peer);
    return it == printsInByPeer_.end() ? nullptr : it->second;
  }
  for (const auto& p : printsIn_) {
    if (p->request->peer == peer) return p.get();
  }
  return nullptr;
}

Request* Op::printFrom(int peer) const {
  const PrintIn* in = printIn(peer);
  return in != nullptr ? in->request : nullptr;
}

const char* Op::inlinePayload(int peer) const {
  const PrintIn* in = printIn(peer);
  return in != nullptr && in->request->done ? in->bytes + sizeof(CallPrint) : nullptr;
}

void Op::startCallCheck() {
  const int n = size();
  if (inlined()) {
    printOut_.resize(sizeof(CallPrint) + inlineBytes_);
    std::memcpy(printOut_.data(), &print_, sizeof(CallPrint));
    std::memcpy(printOut_.data() + sizeof(CallPrint), inlineData_, inlineBytes_);
  }
  callCheckStarted_ = true;
  sendPrint((rank() + 1) % n);
  askPrint((rank() + n - 1) % n);
}

bool Op::markPrint(int peer, uint8_t bit) {
  if (size() <= 64) {  // no allocation for most groups
    uint64_t& mask = bit == kPrintSent ? printsSentMask_ : printsAskedMask_;
    const uint64_t one = uint64_t{1} << peer;
    const bool was = (mask & one) != 0;
    mask |= one;
    return was;
  }
  if (printFlags_.empty()) printFlags_.assign(static_cast<size_t>(size()), 0);
  const bool was = (printFlags_[peer] & bit) != 0;
  printFlags_[peer] |= bit;
  return was;
}

bool Op::callCheckDone() const {
  for (const Request* r : printRequests_) {
    if (!r->done) return false;
  }
  return true;
}

bool Op::isStartPrint(const Request& req) const {
  // Every rank sends its print to the next as it starts; the prints it sends to other peers go
  // before its first message to each, so a missing one only says it has not got that far.
  return req.isCallPrint && !req.isSend && req.peer == (rank() + size() - 1) % size();
}

void Op::sendPrint(int peer) {
  if (markPrint(peer, kPrintSent)) return;
  Request* req = newRequest(peer, true);
  req->isCallPrint = true;
  printRequests_.push_back(req);
  const void* bytes = inlined() ? static_cast<const void*>(printOut_.data()) : &print_;
  const size_t length = inlined() ? printOut_.size() : sizeof(print_);
  postSend(req, kPrintSlot, bytes, length);
}

void Op::askPrint(int peer) {
  if (markPrint(peer, kPrintAsked)) return;
  // Marked before it is posted: the transport may complete it inside recv().
  Request* req = newRequest(peer, false);
  req->isCallPrint = true;
  printsIn_.push_back(std::make_unique<PrintIn>());
  PrintIn& in = *printsIn_.back();
  in.request = req;
  // Past a few peers (an all_to_all asks every rank) they are looked up by peer.
  constexpr size_t kScanned = 16;
  if (printsIn_.size() > kScanned) {
    if (printsInByPeer_.empty()) {
      for (const auto& p : printsIn_) printsInByPeer_[p->request->peer] = p.get();
    } else {
      printsInByPeer_[peer] = &in;
    }
  }
  printRequests_.push_back(req);
  postReceive(req, kPrintSlot, in.bytes, sizeof(in.bytes));
}

Request* Op::recvAny(uint64_t slot, void* data, size_t bytes) {
  Request* req = newRequest(-1, false);
  uint64_t t = tag::make(group_->id, sequence_, slot, 0);
  group_->runtime->transport().recv(t, tag::kAnySource, data, bytes, req);
  return req;
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

Op::Until Op::yieldTurn() {
  wakeAt(group_->runtime->clock().now());
  auto asked = std::make_shared<bool>(false);
  return until([asked] { return std::exchange(*asked, true); });
}

std::string Op::pendingPeers() const {
  std::set<int> recvFrom, sendTo, notStarted;
  bool fromAnyone = false;
  for (const auto& r : requests_) {
    if (r->done) continue;
    if (isStartPrint(*r)) notStarted.insert(r->peer);  // it has not sent its print yet
    if (r->peer < 0) {
      fromAnyone = true;
      continue;
    }
    (r->isSend ? sendTo : recvFrom).insert(r->peer);
  }
  auto list = [](const std::set<int>& ranks) {
    std::string s;
    for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  };
  std::string text;
  if (!recvFrom.empty()) {
    text += "no data arrived from rank" + std::string(recvFrom.size() > 1 ? "s " : " ") +
            list(recvFrom);
  }
  if (fromAnyone) text += std::string(text.empty() ? "" : "; ") + "no data arrived from any rank";
  if (!sendTo.empty()) {
    text += (text.empty() ? "" : "; ") + std::string("rank") + (sendTo.size() > 1 ? "s " : " ") +
            list(sendTo) + " did not take the data sent to it";
  }
  if (!notStarted.empty()) {
    text += (text.empty() ? "" : "; ") + std::string("rank") +
            (notStarted.size() > 1 ? "s " : " ") + list(notStarted) +
            (notStarted.size() > 1 ? " have" : " has") + " not started this op";
  }
  return text.empty() ? "no message outstanding" : text;
}

Op::Waits Op::waits() const {
  Waits w;
  for (const auto& r : requests_) {
    if (r->done || r->peer < 0) continue;
    w.peers.insert(r->peer);
    if (isStartPrint(*r)) w.notStarted.insert(r->peer);
  }
  return w;
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

std::string Op::waitChain(bool notStartedSaid) const {
  const Waits own = waits();
  std::string text;
  if (!notStartedSaid) {
    for (int r : own.notStarted) text += "; rank " + std::to_string(r) + " has not started this op";
  }
  if (reportedWaits.empty()) return text;
  // Who saw which rank not start the op (this rank first).
  std::map<int, int> notStartedSeenBy;
  for (int r : own.notStarted) notStartedSeenBy.emplace(r, rank());
  for (const auto& [from, w] : reportedWaits) {
    for (int r : w.notStarted) notStartedSeenBy.emplace(r, from);
  }
  // Breadth first from the peers this rank waits for, through the ranks that reported waiting,
  // to the ranks at the ends of the waits: ones that had not started the op, and ones in it that
  // sent no report (stopped, or not in the op: it is not known which).
  std::map<int, int> via;  // rank -> the rank it was reached from (-1: waited for here)
  std::vector<int> queue;
  for (int r : own.peers) {
    via.emplace(r, -1);
    queue.push_back(r);
  }
  std::vector<std::pair<int, std::string>> ends;
  for (size_t i = 0; i < queue.size(); ++i) {
    const int r = queue[i];
    if (auto seen = notStartedSeenBy.find(r); seen != notStartedSeenBy.end()) {
      ends.emplace_back(r, "has not started this op" +
                               (seen->second == rank()
                                    ? std::string()
                                    : " (rank " + std::to_string(seen->second) + " saw no call)"));
      continue;
    }
    auto report = reportedWaits.find(r);
    if (report == reportedWaits.end()) {
      ends.emplace_back(r, "sent no report halfway to the timeout (stopped, or not in this op)");
      continue;
    }
    for (int next : report->second.peers) {
      if (next == rank() || !via.emplace(next, r).second) continue;
      queue.push_back(next);
    }
  }
  for (const auto& [r, why] : ends) {
    if (via[r] == -1 && own.notStarted.count(r)) continue;  // said already
    std::vector<int> path;
    for (int at = via[r]; at != -1; at = via[at]) path.push_back(at);
    std::string through;
    if (!path.empty()) {
      through = " through rank" + std::string(path.size() > 1 ? "s " : " ");
      for (size_t k = path.size(); k-- > 0;) {
        through += std::to_string(path[k]) + (k ? ", " : "");
      }
    }
    text += "; the wait leads" + through + " to rank " + std::to_string(r) + ", which " + why;
  }
  return text;
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
