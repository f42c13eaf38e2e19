#include "call_print.h"

#include <algorithm>
#include <cstring>

#include "../base/tag.h"
#include "op.h"

namespace ddl {

bool CallPrint::operator==(const CallPrint& other) const {
  return magic == other.magic && sequence == other.sequence && collective == other.collective &&
         type == other.type && reduce == other.reduce && root == other.root &&
         count == other.count && mismatchAge == other.mismatchAge;
}

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::kNone:
      return "no collective";
    case Collective::kAllreduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllgather:
    case Collective::kAllgatherVarying:
      return "all_gather";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kReduce:
      return "reduce";
    case Collective::kGather:
      return "gather";
    case Collective::kScatter:
      return "scatter";
    case Collective::kAlltoall:
      return "all_to_all";
    case Collective::kWindowCreate:
      return "window creation";
    case Collective::kWindowRegister:
      return "tensor_register";
    case Collective::kWindowDeregister:
      return "tensor_deregister";
  }
  return "collective";
}

uint64_t CallPrint::bytes() const {
  return type == kUnset ? 0 : count * elementSize(static_cast<DataType>(type));
}

std::string CallPrint::describe() const {
  const std::string name = collectiveName(collective);
  const std::string elements =
      std::to_string(count) + " x " +
      (type == kUnset ? std::string("?") : dataTypeName(static_cast<DataType>(type)));
  const std::string op = reduce == kUnset ? "" : reduceOpName(static_cast<ReduceOp>(reduce));
  const std::string rootRank = std::to_string(root);
  switch (collective) {
    case Collective::kNone:
      return name;
    case Collective::kAllreduce:
      return name + "(" + op + ", " + elements + ")";
    case Collective::kBroadcast:
      return name + "(" + elements + " from rank " + rootRank + ")";
    case Collective::kAllgather:
      return name + "(" + elements + " per rank)";
    case Collective::kAllgatherVarying:
      return name + "(blocks of any size)";
    case Collective::kReduceScatter:
      return name + "(" + op + ", " + elements + " per rank)";
    case Collective::kReduce:
      return name + "(" + op + ", " + elements + " to rank " + rootRank + ")";
    case Collective::kGather:
      return name + "(" + elements + " per rank to rank " + rootRank + ")";
    case Collective::kScatter:
      return name + "(" + elements + " per rank from rank " + rootRank + ")";
    case Collective::kWindowCreate:
      return name + " (window " + std::to_string(count) + " of the group)";
    case Collective::kBarrier:
    case Collective::kAlltoall:
    case Collective::kWindowRegister:
    case Collective::kWindowDeregister:
      return name + "()";
  }
  return "collective " + std::to_string(static_cast<int>(collective));
}

CallPrint callPrint(Collective collective, size_t count, std::optional<DataType> type,
                    std::optional<ReduceOp> reduce, int root) {
  CallPrint print;
  print.collective = collective;
  print.count = count;
  if (type) print.type = static_cast<uint8_t>(*type);
  if (reduce) print.reduce = static_cast<uint8_t>(*reduce);
  print.root = root;
  return print;
}

// --- CallCheck ---------------------------------------------------------------------------------

namespace {
constexpr uint64_t kPrintSlot = tag::slot(tag::kControlPhase, tag::kPrintStep);

// The latest mismatched op a print says its rank knew of: "op #12", "none".
std::string mismatchWords(const CallPrint& print) {
  if (print.mismatchAge == 0) return "none";
  if (print.mismatchAge == 255) return "one 255 or more ops before";
  return "op #" + std::to_string(print.sequence - print.mismatchAge);
}
}  // namespace

void CallCheck::set(const CallPrint& print) {
  print_ = print;
  print_.sequence = op_.sequence();
}

void CallCheck::setInline(const void* data, size_t bytes) {
  inlineData_ = data;
  inlineBytes_ = bytes <= kInlineMax ? bytes : 0;
}

const CallCheck::PrintIn* CallCheck::in(int peer) const {
  if (!inByPeer_.empty()) {
    auto it = inByPeer_.find(peer);
    return it == inByPeer_.end() ? nullptr : it->second;
  }
  if (askedOne_ && firstIn_.request->peer == peer) return &firstIn_;
  for (const auto& p : ins_) {
    if (p->request->peer == peer) return p.get();
  }
  return nullptr;
}

Request* CallCheck::printFrom(int peer) const {
  const PrintIn* p = in(peer);
  return p != nullptr ? p->request : nullptr;
}

const char* CallCheck::inlinePayload(int peer) const {
  const PrintIn* p = in(peer);
  return p != nullptr && p->request->done ? p->bytes + sizeof(CallPrint) : nullptr;
}

void CallCheck::start() {
  const int n = op_.size();
  if (carries_ && op_.group().state) {
    mismatchAtStart_ = op_.group().state->lastMismatch();
    if (mismatchAtStart_) {
      const uint32_t age = print_.sequence - *mismatchAtStart_;
      print_.mismatchAge = static_cast<uint8_t>(age == 0 || age > 255 ? 255 : age);
    }
  }
  if (inlined()) {
    std::memcpy(out_, &print_, sizeof(CallPrint));
    std::memcpy(out_ + sizeof(CallPrint), inlineData_, inlineBytes_);
  }
  started_ = true;
  requests_.reserve(2);  // one print sent and one asked for, in most ops: one allocation
  const PrintRing& ring = op_.group().printRing;
  send(ring.next < 0 ? (op_.rank() + 1) % n : ring.next);
  askPrevious();
}

void CallCheck::askPrevious() {
  const PrintRing& ring = op_.group().printRing;
  if (ring.next < 0) {
    ask((op_.rank() + op_.size() - 1) % op_.size());
    return;
  }
  for (int previous : ring.previous) ask(previous);
}

void CallCheck::watch() {
  watching_ = true;
  const size_t asked = requests_.size();
  askPrevious();
  requests_.resize(asked);  // not waited for
}

bool CallCheck::mark(int peer, uint8_t bit) {
  if (op_.size() <= 64) {  // no allocation for most groups
    uint64_t& mask = bit == kSent ? sentMask_ : askedMask_;
    const uint64_t one = uint64_t{1} << peer;
    const bool was = (mask & one) != 0;
    mask |= one;
    return was;
  }
  // The peers this op meets, not the group: O(log P) in most, looked through while they are few
  // (this runs for every message), hashed past that (an all_to_all meets every rank).
  auto set = [bit](uint8_t& flags) {
    const bool was = (flags & bit) != 0;
    flags |= bit;
    return was;
  };
  if (flags_.empty()) {
    for (size_t i = 0; i < fewMet_; ++i) {
      if (few_[i].first == peer) return set(few_[i].second);
    }
    if (fewMet_ < few_.size()) {
      few_[fewMet_++] = {peer, bit};
      return false;
    }
    for (const auto& [met, flags] : few_) flags_[met] = flags;
  }
  return set(flags_[peer]);
}

bool CallCheck::done() const {
  for (const Request* r : requests_) {
    if (!r->done) return false;
  }
  return true;
}

bool CallCheck::isStartPrint(const Request& req) const {
  // Every rank sends its print to the next as it starts; the prints it sends to other peers go
  // before its first message to each, so a missing one only says it has not got that far.
  if (!req.isCallPrint || req.isSend || watching_) return false;
  const PrintRing& ring = op_.group().printRing;
  if (ring.next < 0) return req.peer == (op_.rank() + op_.size() - 1) % op_.size();
  return std::find(ring.previous.begin(), ring.previous.end(), req.peer) != ring.previous.end();
}

PrintRing printRing(int rank, int size, const BlockPlan* grid) {
  PrintRing ring;
  if (grid == nullptr || grid->empty()) {
    ring.next = (rank + 1) % size;
    ring.previous.push_back((rank + size - 1) % size);
    return ring;
  }
  std::vector<int> dims;  // those with more than one place, innermost first
  for (size_t k = 0; k < grid->dims.size(); ++k) {
    if (grid->dims[k] > 1) dims.push_back(static_cast<int>(k));
  }
  auto next = [&](std::vector<int> c) {
    for (int k : dims) {
      if (c[k] + 1 < grid->dims[k]) {
        ++c[k];
        return grid->rankAt[grid->placeOf(c)];
      }
    }
    c[dims.back()] = 0;
    return grid->rankAt[grid->placeOf(c)];
  };
  const std::vector<int>& mine = grid->coords[rank];
  ring.next = next(mine);
  for (int k : dims) {  // whose next this rank is: one place back along some dimension
    std::vector<int> c = mine;
    c[k] = (c[k] + grid->dims[k] - 1) % grid->dims[k];
    if (next(c) == rank) ring.previous.push_back(grid->rankAt[grid->placeOf(c)]);
  }
  return ring;
}

void CallCheck::send(int peer) {
  if (mark(peer, kSent)) return;
  Request* req = op_.newRequest(peer, true);
  req->isCallPrint = true;
  requests_.push_back(req);
  const void* bytes = inlined() ? static_cast<const void*>(out_) : &print_;
  const size_t length = inlined() ? sizeof(CallPrint) + inlineBytes_ : sizeof(print_);
  op_.postSend(req, op_.sequence(), kPrintSlot, bytes, length);
}

void CallCheck::ask(int peer) {
  if (mark(peer, kAsked)) return;
  // Marked before it is posted: the transport may complete it inside recv().
  Request* req = op_.newRequest(peer, false);
  req->isCallPrint = true;
  if (!askedOne_) {
    askedOne_ = true;
  } else {
    ins_.push_back(std::make_unique<PrintIn>());
  }
  PrintIn& p = ins_.empty() ? firstIn_ : *ins_.back();
  p.request = req;
  // Past a few peers (an all_to_all asks every rank) they are looked up by peer.
  constexpr size_t kScanned = 16;
  if (1 + ins_.size() > kScanned) {
    if (inByPeer_.empty()) {
      inByPeer_[firstIn_.request->peer] = &firstIn_;
      for (const auto& q : ins_) inByPeer_[q->request->peer] = q.get();
    } else {
      inByPeer_[peer] = &p;
    }
  }
  requests_.push_back(req);
  op_.postReceive(req, op_.sequence(), kPrintSlot, p.bytes, sizeof(p.bytes));
}

Status CallCheck::verdict(const Request& req) const {
  const std::string rank = "rank " + std::to_string(req.peer);
  auto peer = [&req] { return std::vector<int>{req.peer}; };  // built for a failure only
  const PrintIn* p = in(req.peer);
  CallPrint theirs;
  if (p != nullptr && req.receivedBytes >= sizeof(CallPrint)) {
    std::memcpy(&theirs, p->bytes, sizeof(theirs));
  }
  // A print that cannot be read is a disagreement too: as one that differs, it fails the op on
  // every rank (found, or told), so each knows it as the group's latest mismatched op alike
  // (GroupState::countMismatch) and their shared-memory windows resync at the same op.
  if (p == nullptr || req.receivedBytes < sizeof(CallPrint) || theirs.magic != CallPrint::kMagic) {
    return Status(StatusKind::kMismatch, rank + " sent a malformed call check", peer());
  }
  if (watching_) {            // any print: that rank checks this op by prints, this one does not
    CallPrint same = theirs;  // the same call, but for the mismatch it carries
    same.mismatchAge = print_.mismatchAge;
    return Status(StatusKind::kMismatch,
                  "the ranks' calls differ: " + rank + " called " + theirs.describe() +
                      " and checked it by a print, rank " + std::to_string(op_.rank()) +
                      " called " + print_.describe() +
                      " as a one-step allreduce over shared memory, which sends none" +
                      (same == print_ ? " (they decided differently whether the group's "
                                        "shared-memory windows must be mended first)"
                                      : ""),
                  peer());
  }
  if (!(theirs == print_)) {
    // Only the latest mismatch known differs: the same call, started knowing of different ones.
    CallPrint same = theirs;
    same.mismatchAge = print_.mismatchAge;
    if (same == print_) {
      return Status(StatusKind::kMismatch,
                    "the ranks started this op knowing of different earlier mismatched ops "
                    "of the group: " +
                        rank + " of " + mismatchWords(theirs) + ", rank " +
                        std::to_string(op_.rank()) + " of " + mismatchWords(print_) +
                        " as the latest (the news of one had not reached every rank): the op "
                        "fails on every rank, so that the next allreduce resyncs their "
                        "shared-memory windows at the same op",
                    peer());
    }
    std::string words = "the ranks' calls differ: " + rank + " called " + theirs.describe() +
                        ", rank " + std::to_string(op_.rank()) + " called " + print_.describe();
    if (theirs.sequence != print_.sequence) {
      words += " (as op #" + std::to_string(theirs.sequence) + ")";
    }
    return Status(StatusKind::kMismatch, std::move(words), peer());
  }
  if (inlined() && req.receivedBytes != sizeof(CallPrint) + inlineBytes_) {
    return Status(StatusKind::kMismatch,
                  rank + "'s call check carried " +
                      std::to_string(req.receivedBytes - sizeof(CallPrint)) +
                      " bytes of data where this rank expects " + std::to_string(inlineBytes_) +
                      " (the ranks' settings differ)",
                  peer());
  }
  return Status();
}

}  // namespace ddl
