#include "network.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {

namespace {

constexpr int64_t kNever = INT64_MAX;
constexpr uint64_t kNoMessage = UINT64_MAX;

int64_t transferNs(size_t bytes, double bandwidth) {
  if (bytes == 0 || !(bandwidth > 0)) return 0;
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / bandwidth * 1e9));
}

void mix(uint64_t* digest, uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    *digest ^= (value >> (8 * i)) & 0xff;
    *digest *= 1099511628211ull;
  }
}

}  // namespace

// What a packet's booking reads, in one cache line; the bytes and a put's target are kept
// apart (SimNetwork::Cold), by the same index.
struct alignas(64) SimNetwork::Message {
  int from;
  int to;
  uint64_t tag;
  size_t size;
  uint64_t sendIndex = 0;      // its request's slot
  size_t booked = 0;           // bytes whose links are booked
  int64_t end = 0;             // when the last packet booked so far leaves its slowest link
  uint64_t next = kNoMessage;  // the pair's next message, booked once this one is
  enum : uint8_t { kTagged, kPut, kFlush } kind = kTagged;
  uint8_t level = 0;  // of the links it crosses (levelBetween)
  bool cold = false;  // it has bytes, or is a put or a flush: its Cold is read on arrival
};

struct SimNetwork::Cold {
  std::vector<char> bytes;  // empty without payload
  uint64_t region = 0;      // a put's target region; a flush's id
  size_t offset = 0;        // a put's
};

SimNetwork::SimNetwork(SimNetworkSpec spec) : spec_(std::move(spec)) {
  const size_t n = spec_.hostOf.size();
  int hosts = 0, racks = 0;
  for (int h : spec_.hostOf) hosts = std::max(hosts, h + 1);
  if (spec_.rackOf.size() < static_cast<size_t>(hosts)) spec_.rackOf.resize(hosts, 0);
  for (int k : spec_.rackOf) racks = std::max(racks, k + 1);
  if (spec_.levels.size() < 3)
    spec_.levels.resize(3, spec_.levels.empty() ? SimLevel{} : spec_.levels.back());
  transports_.assign(n, nullptr);
  busyUntil_.assign(n, 0);
  turnAt_.assign(n, kNever);
  dead_.assign(n, false);
  stallUntil_.assign(n, 0);
  slowRank_.assign(n, 1.0);
  slowNic_.assign(hosts, 1.0);
  pairs_.resize(n);
  endpointsOf_.resize(n);
  shmOut_.assign(n, SimLink{});
  shmIn_.assign(n, SimLink{});
  nicOut_.assign(hosts, SimLink{});
  nicIn_.assign(hosts, SimLink{});
  upOut_.assign(racks, SimLink{});
  upIn_.assign(racks, SimLink{});
  for (int level = 0; level < 3; ++level) {
    latencyNs_[level] = static_cast<int64_t>(std::llround(spec_.levels[level].latency * 1e9));
    overheadNs_[level] = static_cast<int64_t>(std::llround(spec_.levels[level].overhead * 1e9));
  }
}

SimNetwork::~SimNetwork() = default;

std::unique_ptr<SimTransport> SimNetwork::join(int rank) {
  auto transport = std::make_unique<SimTransport>(this, rank);
  transports_.at(rank) = transport.get();
  return transport;
}

std::string SimNetwork::offerWindow(int rank, const std::shared_ptr<char[]>& memory, size_t bytes) {
  std::erase_if(windows_, [](const auto& w) { return w.second.memory.expired(); });
  const std::string key = "window:" + std::to_string(nextWindowKey_++);
  windows_[key] = Window{memory, bytes, spec_.hostOf[rank]};
  return key;
}

std::shared_ptr<char[]> SimNetwork::findWindow(int rank, const std::string& key, size_t* bytes) {
  auto it = windows_.find(key);
  if (!spec_.windows || it == windows_.end() || it->second.host != spec_.hostOf[rank]) {
    return nullptr;
  }
  *bytes = it->second.bytes;
  return it->second.memory.lock();
}

TimePoint SimNetwork::point(int64_t ns) { return TimePoint(std::chrono::nanoseconds(ns)); }

TimePoint SimNetwork::timeOf(int rank) const {
  if (rank == turning_) return point(local_);
  return point(std::max(ns(now_), busyUntil_[rank]));
}

void SimNetwork::charge(double seconds) {
  if (turning_ >= 0 && seconds > 0) {
    local_ += static_cast<int64_t>(std::ceil(seconds * slowRank_[turning_] * 1e9));
  }
}

void SimNetwork::waitUntil(int rank, TimePoint until) {
  if (rank == turning_) {
    if (waitHook_ != nullptr && waitEvery_ > 0) {
      while (local_ + waitEvery_ < ns(until)) {
        local_ += waitEvery_;
        (*waitHook_)();
      }
    }
    local_ = std::max(local_, ns(until));
  } else {
    busyUntil_.at(rank) = std::max(busyUntil_.at(rank), ns(until));
  }
}

void SimNetwork::waitingFor(const std::function<void()>& call,
                            const std::function<void()>& meanwhile,
                            std::chrono::nanoseconds every) {
  struct Unset {
    SimNetwork& network;
    ~Unset() { network.waitHook_ = nullptr; }
  } unset{*this};
  waitHook_ = &meanwhile;
  waitEvery_ = every.count();
  call();
}

void SimNetwork::push(int64_t at, Kind kind, int rank, int other, uint64_t index) {
  queue_.push(Event{at, order_++ << 8 | static_cast<uint64_t>(kind), rank, other, index});
}

void SimNetwork::wake(int rank, TimePoint at) {
  if (dead_[rank] || rank == turning_) return;
  const int64_t t = std::max(ns(at), ns(now_));
  if (t >= turnAt_[rank]) return;
  turnAt_[rank] = t;
  push(t, Kind::kTurn, rank);
}

void SimNetwork::kill(const std::vector<int>& ranks, TimePoint at) {
  batches_.push_back(ranks);
  push(ns(at), Kind::kKill, -1, -1, batches_.size() - 1);
}

void SimNetwork::cut(int a, int b, TimePoint at) { push(ns(at), Kind::kCut, a, b); }

void SimNetwork::partition(const std::vector<int>& side, TimePoint at) {
  batches_.push_back(side);
  push(ns(at), Kind::kPartition, -1, -1, batches_.size() - 1);
}

void SimNetwork::stall(int rank, TimePoint from, TimePoint until) {
  push(ns(from), Kind::kStall, rank, -1, static_cast<uint64_t>(ns(until)));
}

void SimNetwork::slow(int rank, double factor) { slowRank_.at(rank) = factor; }

void SimNetwork::slowLink(int host, double factor) { slowNic_.at(host) = factor; }

void SimNetwork::slowReductions(int rank, double factor) {
  if (slowReduce_.empty()) slowReduce_.assign(size(), 1.0);
  slowReduce_.at(rank) = factor;
}

void SimNetwork::chargeReduction(double seconds) {
  if (turning_ >= 0 && !slowReduce_.empty()) seconds *= slowReduce_[turning_];
  charge(seconds);
}

uint64_t SimNetwork::strayPuts() const {
  uint64_t stray = 0;
  for (const SimTransport* t : transports_) stray += t != nullptr ? t->strayPuts() : 0;
  return stray;
}

bool SimNetwork::severed(int a, int b) const {
  if (!side_.empty() && side_[a] != side_[b]) return true;
  return !cuts_.empty() && cuts_.count({std::min(a, b), std::max(a, b)}) > 0;
}

int SimNetwork::levelBetween(int a, int b) const {
  const int ha = spec_.hostOf[a], hb = spec_.hostOf[b];
  if (ha == hb) return 0;
  return spec_.rackOf[ha] == spec_.rackOf[hb] ? 1 : 2;
}

int64_t SimNetwork::overheadNs(int from, int to) const {
  return overheadNs_[levelBetween(from, to)];
}

int64_t SimNetwork::overheadNs(const Message& m) const { return overheadNs_[m.level]; }

void SimNetwork::lose(int rank, int peer, int64_t at) { push(at, Kind::kLost, rank, peer); }

void SimNetwork::connected(int from, int to) {
  endpointsOf_[from].insert(to);
  // A connection to a dead process on a live host is refused (its host answers).
  if (!dead_[to] || severed(from, to)) return;
  for (int r = 0; r < size(); ++r) {
    if (spec_.hostOf[r] == spec_.hostOf[to] && !dead_[r]) {
      lose(from, to, ns(now_) + latencyNs(levelBetween(from, to)));
      return;
    }
  }
}

int SimNetwork::endpoints(int rank) const { return static_cast<int>(endpointsOf_[rank].size()); }

double SimNetwork::busiestLink(int level) const {
  const std::vector<SimLink>* links[3][2] = {
      {&shmOut_, &shmIn_}, {&nicOut_, &nicIn_}, {&upOut_, &upIn_}};
  int64_t most = 0;
  for (const std::vector<SimLink>* side : links[std::clamp(level, 0, 2)]) {
    for (const SimLink& link : *side) most = std::max(most, link.bookedNs());
  }
  return static_cast<double>(most) * 1e-9;
}

uint64_t SimNetwork::messagesOfSlot(uint64_t slot) const {
  auto it = bySlot_.find(slot);
  return it == bySlot_.end() ? 0 : it->second;
}

uint64_t SimNetwork::messagesOfOp(uint32_t group, uint32_t sequence, int wide) const {
  uint64_t n = 0;
  for (uint32_t x = 0; x < (1u << wide); ++x) {
    auto it = byOp_.find(tag::make(group ^ x, sequence, 0, 0) >> tag::kSequenceShift);
    if (it != byOp_.end()) n += it->second;
  }
  return n;
}

uint64_t SimNetwork::newMessage(int from, int to, uint64_t tag, size_t bytes, Request* req) {
  uint64_t index;
  if (!freeMessages_.empty()) {
    index = freeMessages_.back();
    freeMessages_.pop_back();
    inFlight_[index] = Message{from, to, tag, bytes};
  } else {
    index = inFlight_.size();
    inFlight_.push_back(Message{from, to, tag, bytes});
    cold_.emplace_back();
  }
  Message& message = inFlight_[index];
  message.level = static_cast<uint8_t>(levelBetween(from, to));
  if (!freeSends_.empty()) {
    message.sendIndex = freeSends_.back();
    freeSends_.pop_back();
    sends_[message.sendIndex] = req;
  } else {
    message.sendIndex = sends_.size();
    sends_.push_back(req);
  }
  ++messages_;
  bytes_ += bytes;
  return index;
}

void SimNetwork::launch(uint64_t index, int64_t at) {
  // A pair's messages leave in the order they were sent, one after another (one connection).
  const Message& message = inFlight_[index];
  Pair& p = laneOf(message);
  if (p.tail != kNoMessage) {
    inFlight_[p.tail].next = index;
    p.tail = index;
    return;
  }
  p.tail = index;
  bookPacket(index, at);
}

void SimNetwork::send(int from, int to, uint64_t tag, const void* data, size_t bytes,
                      Request* req) {
  if (from == turning_) charge(static_cast<double>(overheadNs(from, to)) * 1e-9);
  const int64_t t0 = from == turning_ ? local_ : ns(timeOf(from));
  const uint64_t index = newMessage(from, to, tag, bytes, req);
  // Without payload, data is sizes only; what the engine itself says (call prints, notices, the
  // group's creation: the control phase) always carries its bytes.
  const uint64_t phase =
      (tag >> (tag::kSlotShift + tag::kStepBits)) & ((1u << tag::kPhaseBits) - 1);
  if ((spec_.payload || phase == tag::kControlPhase) && bytes > 0) {
    inFlight_[index].cold = true;
    cold_[index].bytes.assign(static_cast<const char*>(data),
                              static_cast<const char*>(data) + bytes);
  }
  ++bySlot_[(tag >> tag::kSlotShift) & ((uint64_t{1} << tag::kSlotBits) - 1)];
  const uint64_t step = (tag >> tag::kSlotShift) & (tag::kMaxSteps - 1);
  if (phase != tag::kControlPhase || step == tag::kPrintStep ||
      (step >= tag::kSizesStep && step < tag::kSizesStep + tag::kSizesSteps)) {
    ++byOp_[tag >> tag::kSequenceShift];
  }
  if (from == recorded_ && sentByRecorded_.size() < 4096)
    sentByRecorded_.push_back(Sent{to, tag, cold_[index].bytes});
  launch(index, t0);
}

void SimNetwork::put(int from, int to, uint64_t region, size_t offset, const void* data,
                     size_t bytes, Request* req) {
  if (from == turning_) charge(static_cast<double>(overheadNs(from, to)) * 1e-9);
  const int64_t t0 = from == turning_ ? local_ : ns(timeOf(from));
  const uint64_t index = newMessage(from, to, 0, bytes, req);
  inFlight_[index].kind = Message::kPut;
  inFlight_[index].cold = true;
  Cold& message = cold_[index];
  message.region = region;
  message.offset = offset;
  if (spec_.payload && bytes > 0) {
    message.bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  }
  launch(index, t0);
}

void SimNetwork::flush(int from, int to, uint64_t id) {
  const int64_t t0 = from == turning_ ? local_ : ns(timeOf(from));
  const uint64_t index = newMessage(from, to, 0, 0, nullptr);
  inFlight_[index].kind = Message::kFlush;
  inFlight_[index].cold = true;
  cold_[index].region = id;
  launch(index, t0);
}

void SimNetwork::bookPacket(uint64_t index, int64_t at) {
  Message& m = inFlight_[index];
  const int level = m.level;
  const double hostBw = spec_.levels[0].bandwidth, nicBw = spec_.levels[1].bandwidth,
               rackBw = spec_.levels[2].bandwidth;
  const int hf = spec_.hostOf[m.from], ht = spec_.hostOf[m.to];
  struct Hop {
    SimLink* link;
    double bandwidth;
  };
  Hop hops[4];
  int count = 0;
  if (level == 0) {
    hops[count++] = {&shmOut_[m.from], hostBw};
    hops[count++] = {&shmIn_[m.to], hostBw};
  } else {
    hops[count++] = {&nicOut_[hf], nicBw / slowNic_[hf]};
    if (level == 2) {
      hops[count++] = {&upOut_[spec_.rackOf[hf]], rackBw};
      hops[count++] = {&upIn_[spec_.rackOf[ht]], rackBw};
    }
    hops[count++] = {&nicIn_[ht], nicBw / slowNic_[ht]};
  }
  size_t packet = level == 0 ? spec_.hostPacketBytes : spec_.packetBytes;
  bool free = true;
  for (int i = 0; i < count && free; ++i) free = hops[i].link->freeFrom(at);
  if (free) packet = std::max(packet, spec_.burstBytes);
  const size_t size = std::min(packet, m.size - m.booked);
  int64_t start = at, left = at;
  for (int i = 0; i < count; ++i) {
    const int64_t length = transferNs(size, hops[i].bandwidth);
    start = hops[i].link->book(ns(now_), start, length);
    m.end = std::max(m.end, start + length);
    if (i == 0) left = start + length;
  }
  m.booked += size;
  if (m.booked < m.size) {  // the next packet once this one has left the sender
    push(left, Kind::kPacket, m.from, m.to, index);
    return;
  }
  push(left, Kind::kSent, m.from, m.to, m.sendIndex);
  Pair& p = laneOf(m);
  // One-sided traffic takes its own way, longer than messages' (a NIC's RDMA engine, a CMA copy
  // made by the target's transport): a put posted before a message may land after it.
  const int64_t way = m.kind == Message::kTagged ? 0 : 3 * latencyNs(level);
  p.lastArrival = std::max(m.end + latencyNs(level) + way, p.lastArrival);
  push(p.lastArrival, Kind::kArrive, m.to, m.from, index);
  if (m.next != kNoMessage) {
    push(left, Kind::kPacket, m.from, m.to, m.next);
  } else {
    p.tail = kNoMessage;
  }
}

void SimNetwork::take() {
  queue_.pop();
  constexpr size_t kMessageAhead = 8, kLinkAhead = 4;
  if (const Event* e = queue_.ahead(kMessageAhead)) {
    if (e->kind() == Kind::kPacket || e->kind() == Kind::kArrive) {
      __builtin_prefetch(&inFlight_[e->index]);
    }
  }
  if (const Event* e = queue_.ahead(kLinkAhead); e != nullptr && e->kind() == Kind::kPacket) {
    const Message& m = inFlight_[e->index];
    __builtin_prefetch(m.level == 0 ? &shmOut_[m.from] : &nicOut_[spec_.hostOf[m.from]]);
  }
}

SimNetwork::Pair& SimNetwork::laneOf(const Message& m) {
  return pair(m.from, m.kind == Message::kTagged ? m.to : m.to + size());
}

SimNetwork::Pair& SimNetwork::pair(int from, int to) {
  std::vector<Pair>& pairs = pairs_[from];
  auto it = std::lower_bound(pairs.begin(), pairs.end(), to,
                             [](const Pair& p, int rank) { return p.to < rank; });
  if (it == pairs.end() || it->to != to) it = pairs.insert(it, Pair{to, 0, kNoMessage});
  return *it;
}

void SimNetwork::advanceTo(TimePoint until) {
  run([] { return false; }, until);
  now_ = std::max(now_, until);
}

void SimNetwork::onArrive(const Event& e) {
  const Message m = inFlight_[e.index];
  Cold cold = m.cold ? std::move(cold_[e.index]) : Cold{};  // left empty for its next use
  freeMessages_.push_back(e.index);
  if (dead_[m.to] || severed(m.from, m.to)) return;
  mix(&digest_, static_cast<uint64_t>(e.at));
  mix(&digest_, (static_cast<uint64_t>(m.from) << 32) | static_cast<uint32_t>(m.to));
  mix(&digest_, m.tag);
  mix(&digest_, m.size);
  if (m.kind == Message::kPut) {  // lands with nothing asked of the receiver
    transports_[m.to]->land(cold.region, cold.offset, cold.bytes, m.size);
    return;
  }
  if (m.kind == Message::kFlush) {  // every put before it has landed: the answer goes back
    push(e.at + latencyNs(m.level), Kind::kFlushed, m.from, m.to, cold.region);
    return;
  }
  transports_[m.to]->arrive(Delivered{m.tag, std::move(cold.bytes), m.size}, overheadNs(m));
  wake(m.to, now_);
}

void SimNetwork::onTurn(const Event& e) {
  if (dead_[e.rank] || e.at != turnAt_[e.rank]) return;
  turnAt_[e.rank] = kNever;
  if (stallUntil_[e.rank] > e.at) {  // stalled: turned when it resumes, if it does
    if (stallUntil_[e.rank] != kNever) wake(e.rank, point(stallUntil_[e.rank]));
    return;
  }
  if (busyUntil_[e.rank] > e.at) {
    wake(e.rank, point(busyUntil_[e.rank]));
    return;
  }
  turning_ = e.rank;
  local_ = e.at;
  const TimePoint next = turn_ ? turn_(e.rank) : TimePoint::max();
  busyUntil_[e.rank] = local_;
  turning_ = -1;
  if (next != TimePoint::max()) wake(e.rank, next);
}

void SimNetwork::onKill(const Event& e) {
  const std::vector<int>& ranks = batches_[e.index];
  for (int r : ranks) {
    if (!dead_[r]) deadRanks_.push_back(r);
    dead_[r] = true;
  }
  for (int d : ranks) {
    // A host still running closes the dead process's connections (and its pidfd fires
    // for the ranks beside it); a host that died tells no one.
    const int host = spec_.hostOf[d];
    bool hostUp = false;
    for (int r = 0; r < size() && !hostUp; ++r) hostUp = spec_.hostOf[r] == host && !dead_[r];
    if (!hostUp) continue;
    for (int r = 0; r < size(); ++r) {
      if (dead_[r] || severed(r, d)) continue;
      if (spec_.hostOf[r] == host || endpointsOf_[r].count(d)) {
        lose(r, d, e.at + latencyNs(levelBetween(r, d)));
      }
    }
  }
}

bool SimNetwork::run(const std::function<bool()>& done, TimePoint limit) {
  if (done()) return true;
  while (!queue_.empty()) {
    const Event e = queue_.top();
    if (e.at > ns(limit)) return false;
    take();
    now_ = point(e.at);
    ++events_;
    switch (e.kind()) {
      case Kind::kArrive:
        onArrive(e);
        break;
      case Kind::kFlushed:
        if (dead_[e.rank] || severed(e.rank, e.other)) break;
        transports_[e.rank]->flushed(e.index);
        wake(e.rank, now_);
        break;
      case Kind::kPacket:
        bookPacket(e.index, e.at);
        break;
      case Kind::kSent: {
        Request* req = sends_[e.index];
        freeSends_.push_back(e.index);
        if (dead_[e.rank] || req == nullptr) break;
        transports_[e.rank]->sent(req);
        wake(e.rank, now_);
        break;
      }
      case Kind::kTurn:
        onTurn(e);
        break;
      case Kind::kKill:
        onKill(e);
        break;
      case Kind::kCut:
        cuts_.insert({std::min(e.rank, e.other), std::max(e.rank, e.other)});
        break;
      case Kind::kPartition:
        if (side_.empty()) side_.assign(size(), 0);
        for (int r : batches_[e.index]) side_[r] = 1;
        break;
      case Kind::kStall:
        stallUntil_[e.rank] = static_cast<int64_t>(e.index);
        break;
      case Kind::kLost: {
        if (dead_[e.rank]) break;
        transports_[e.rank]->lost(e.other, "the process died (simulated)");
        wake(e.rank, now_);
        break;
      }
    }
    if (done()) return true;
  }
  return done();
}

}  // namespace ddl
