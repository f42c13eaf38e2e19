// A simulated network for thousands of ranks in one process, in virtual time: each rank on a
// host, hosts in racks, and every message timed by the links it crosses.
//
// Links. Every rank has a shared-memory port each way (level 0: messages between ranks of one
// host), every host a NIC each way (level 1: messages that leave or enter the host), every rack
// an uplink each way (level 2: messages that leave or enter the rack). A link serialises what
// crosses it, in packets (SimNetworkSpec: 4 KiB across hosts, InfiniBand's usual MTU): a packet
// holds each link for its bytes / bandwidth, in the first free time long enough from when it has
// reached it, and a message's next packet leaves once the one before has left the sender (up to
// 64 KiB at once while nothing else is booked on its path). So
// the ranks of a host share their NIC and the hosts of a rack their uplink, and contention shows;
// messages that cross a link at once share it packet by packet (as a NIC's queues and a switch
// port interleave flows), and a small message is not held behind the whole of a large one. A
// packet flows through its links at once (cut-through): it reaches each link when it has started
// on the one before. A message arrives when its last packet has left the slowest link, plus the
// latency of the outermost level it crosses. A pair's messages leave one after another, in the
// order they were sent (one connection), and arrive in that order. The figures are the cost
// model's (LinkCosts, TORCH_DDL_LINKS syntax): level k's latency and bandwidth per direction.
//
// Time. One event loop in virtual time (nanoseconds) delivers messages and turns ranks (run()).
// A rank that computes (a reduction, a copy: sim/memory.h) is busy until that work is done: its
// sends leave then, and what arrives meanwhile waits for it. Each message costs its sender its
// level's overhead before it leaves, and its receiver the same when it takes it in (LogP's o). The
// same inputs give the same events in the same order, bit for bit.
//
// Faults, as the world makes them, and what the transport sees of each:
//   kill(ranks, at): the ranks stop: never turned again, what is sent to them dropped. Where a
//     host keeps running (not every rank of it died) its kernel closes the dead processes'
//     connections: a rank holding an endpoint to one learns it one latency later (a transport
//     error), a rank that connects to it later one latency after it connects; the host's other
//     ranks learn it one host latency later (a pidfd). Where the whole host died nothing tells
//     anyone: only ddl's heartbeats (runtime/heartbeat.h) and timeouts find it.
//   cut(a, b, at) and partition(side, at): messages between the two ranks, or between the side
//     and the rest, are dropped from then on. Nothing tells anyone (a cut cable sends no reset).
//   stall(rank, from, until): the rank is not turned in between (what arrives waits for it);
//     until TimePoint::max(): never again, though it is not dead.
//   slow(rank, factor): the rank's copies and reductions take `factor` times as long.
//   slowLink(host, factor): the host's NIC moves bytes `factor` times as slowly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../transport/tag_matching.h"
#include "../transport/transport.h"

namespace ddl {

class SimTransport;

// One link's bookings from now on: disjoint busy times in order, touching ones merged.
class SimLink {
 public:
  // The earliest t >= at such that [t, t + length) is free, booked; what ended by `now` (no
  // later than any `at` to come) may be forgotten.
  int64_t book(int64_t now, int64_t at, int64_t length);
  // Nothing is booked from `at` on.
  bool freeFrom(int64_t at) const { return tail_.second <= at; }
  int64_t bookedNs() const { return booked_; }  // every booking's length so far

 private:
  using Span = std::pair<int64_t, int64_t>;  // (start, end) in ns
  // A place among the spans: chunk c, span i of it ({chunks_.size(), 0}: past the last).
  struct Place {
    size_t c = 0, i = 0;
    bool operator==(const Place&) const = default;
  };
  Span& span(Place p) { return chunks_[p.c][p.i]; }
  Place after(Place p) const { return ++p.i < chunks_[p.c].size() ? p : Place{p.c + 1, 0}; }
  Place previous(Place p) const {
    return p.i > 0 ? Place{p.c, p.i - 1} : Place{p.c - 1, chunks_[p.c - 1].size() - 1};
  }
  Place end() const { return Place{chunks_.size(), 0}; }
  // The first span that starts after `at` (end(): none).
  Place firstAfter(int64_t at);
  void insert(Place p, Span span, int64_t now);
  void erase(Place p);
  void forget(int64_t now);  // the spans that ended by `now`

  // The last span is held here, apart from the chunks, so that the commonest bookings (from a
  // time no earlier than its start: a busy link's next packet joins it, an idle link's starts
  // after it) read and write this object alone. At 65 536 ranks the links' spans are far apart in
  // memory, and reaching them through the chunks was most of a packet's cost. Its end is 0 where
  // there is none.
  Span tail_{0, 0};
  // The spans before it in order, in chunks of at most 2 kChunk (none empty): a booking in the
  // middle of a link booked far ahead moves the rest of its chunk, not every later span (at
  // 4 096 ranks an uplink holds about a thousand spans, and most bookings land among them).
  static constexpr size_t kChunk = 64;
  std::vector<std::vector<Span>> chunks_;
  int64_t booked_ = 0;
};

// Events in order of (time, then order made), as a calendar: a bucket per microsecond for the
// next 16 ms, later ones in a heap of their own. The current bucket is sorted once when it is
// reached and taken from the front; what is pushed into it from then on (an event due within the
// same microsecond) goes to a small heap beside it. At 8 192 ranks a microsecond holds
// thousands of events, and popping them one by one from a heap of the whole bucket was most of
// the event loop's own time.
template <typename Event>
class SimCalendar {
 public:
  bool empty() const { return size_ == 0; }
  void push(const Event& e);
  // The next event (the queue must not be empty), then taking it out.
  const Event& top();
  void pop();
  // The current bucket's event k places after the next one taken from it, if it has one (events
  // pushed into the bucket since it was sorted are not counted): what is coming, for prefetching.
  const Event* ahead(size_t k) {
    const std::vector<Event>& b = current();
    return sorted_ && next_ + k < b.size() ? &b[next_ + k] : nullptr;
  }

 private:
  static constexpr int kShift = 10;  // 1 024 ns a bucket
  static constexpr size_t kBuckets = 16384;
  static constexpr size_t kKept = 256;   // events a drained bucket keeps room for
  static constexpr size_t kSpares = 64;  // larger rooms kept for the buckets that fill up
  static bool earlier(const Event& a, const Event& b) { return b > a; }
  // A full bucket about to grow past kKept takes a spare room larger than its own.
  void grow(std::vector<Event>& bucket);
  std::vector<Event>& current() { return buckets_[static_cast<size_t>(current_) % kBuckets]; }
  // Whether the next event is soon_'s front rather than the current bucket's next.
  bool fromSoon() {
    std::vector<Event>& b = current();
    return !soon_.empty() && (next_ == b.size() || earlier(soon_.front(), b[next_]));
  }
  std::vector<std::vector<Event>> buckets_ = std::vector<std::vector<Event>>(kBuckets);
  std::vector<Event> later_;               // a heap: beyond the buckets
  std::vector<Event> soon_;                // a heap: pushed into the current bucket once sorted
  std::vector<std::vector<Event>> spare_;  // rooms drained buckets gave up, for later bursts
  int64_t current_ = 0;                    // the bucket being taken, by time >> kShift
  bool sorted_ = false;                    // the current bucket is sorted, taken up to next_
  size_t next_ = 0;
  size_t inBuckets_ = 0, size_ = 0;  // inBuckets_ counts soon_'s too
};

template <typename Event>
inline void SimCalendar<Event>::grow(std::vector<Event>& bucket) {
  if (bucket.size() < bucket.capacity() || bucket.capacity() < kKept || spare_.empty()) return;
  if (spare_.back().capacity() <= bucket.capacity()) return;
  std::vector<Event> room = std::move(spare_.back());
  spare_.pop_back();
  room.assign(bucket.begin(), bucket.end());
  bucket.swap(room);
}

template <typename Event>
inline void SimCalendar<Event>::push(const Event& e) {
  ++size_;
  const int64_t bucket = e.at >> kShift;
  if (bucket <= current_ && sorted_) {  // the current bucket (or earlier than it: first of all)
    soon_.push_back(e);
    std::push_heap(soon_.begin(), soon_.end(), std::greater<Event>());
    ++inBuckets_;
  } else if (bucket < current_ + static_cast<int64_t>(kBuckets)) {
    std::vector<Event>& b = buckets_[static_cast<size_t>(std::max(bucket, current_)) % kBuckets];
    grow(b);
    b.push_back(e);
    ++inBuckets_;
  } else {
    later_.push_back(e);
    std::push_heap(later_.begin(), later_.end(), std::greater<Event>());
  }
}

template <typename Event>
inline const Event& SimCalendar<Event>::top() {
  while (true) {
    std::vector<Event>& b = current();
    if (!sorted_) {
      std::sort(b.begin(), b.end(), earlier);
      sorted_ = true;
      next_ = 0;
    }
    if (next_ < b.size() || !soon_.empty()) return fromSoon() ? soon_.front() : b[next_];
    // On to the next bucket (straight to the next later event when the buckets are empty),
    // taking in the later events that now fall within the buckets. A bucket drained of a burst
    // gives its room to the spares (room for the next burst, whichever bucket it falls in):
    // each bucket is taken again every kBuckets microseconds, and kept at the most it ever
    // held they came to gigabytes (3.8 GB at 3 072 ranks).
    b.clear();
    if (b.capacity() > kKept) {
      if (spare_.size() < kSpares) spare_.push_back(std::move(b));
      b = std::vector<Event>();
    }
    sorted_ = false;
    current_ = inBuckets_ == 0 ? later_.front().at >> kShift : current_ + 1;
    while (!later_.empty() &&
           (later_.front().at >> kShift) < current_ + static_cast<int64_t>(kBuckets)) {
      const Event e = later_.front();
      std::pop_heap(later_.begin(), later_.end(), std::greater<Event>());
      later_.pop_back();
      buckets_[static_cast<size_t>(std::max(e.at >> kShift, current_)) % kBuckets].push_back(e);
      ++inBuckets_;
    }
  }
}

template <typename Event>
inline void SimCalendar<Event>::pop() {
  top();
  if (fromSoon()) {
    std::pop_heap(soon_.begin(), soon_.end(), std::greater<Event>());
    soon_.pop_back();
  } else {
    ++next_;
  }
  --inBuckets_;
  --size_;
}

// One level's links: latency (seconds) and bandwidth (bytes per second, per direction), and the
// time a rank's processor spends on each message it sends or receives across the level.
struct SimLevel {
  double latency = 0;
  double bandwidth = 0;
  double overhead = 0;
};

struct SimNetworkSpec {
  std::vector<int> hostOf;       // by rank
  std::vector<int> rackOf;       // by host
  std::vector<SimLevel> levels;  // 0: within a host, 1: between hosts of a rack, 2: between racks
  bool payload = true;  // messages carry their bytes (false: sizes only, but for control messages)
  // The ranks of a host map each other's shared windows (SimTransport::allocateWindow): the
  // shared-memory paths of one host, whose bytes move in memory with no message and no time
  // charged. Only with the payload on for the whole run (those paths touch the bytes).
  bool windows = false;
  // Links interleave messages in packets of this size: 4 KiB across hosts (InfiniBand's usual
  // MTU); 64 KiB within a host, where only messages of the host's own rings meet. A message that
  // finds every link of its path free books up to `burstBytes` at once (a NIC's offloaded
  // segment), so that what comes after waits for at most that much of it.
  size_t packetBytes = 4096;
  size_t hostPacketBytes = 65536;
  size_t burstBytes = 65536;
};

class SimNetwork {
 public:
  explicit SimNetwork(SimNetworkSpec spec);
  ~SimNetwork();
  int size() const { return static_cast<int>(spec_.hostOf.size()); }
  bool payload() const { return spec_.payload; }
  void carryPayload(bool on) { spec_.payload = on; }
  const SimNetworkSpec& spec() const { return spec_; }

  // The transport of `rank` (the network keeps a pointer; it must outlive nothing here).
  std::unique_ptr<SimTransport> join(int rank);
  // What the event loop calls to turn a rank (the cluster turns its engine); it returns when
  // the rank must be turned next although nothing arrives (TimePoint::max(): never).
  void setTurn(std::function<TimePoint(int rank)> turn) { turn_ = std::move(turn); }

  // Virtual time: of the event being handled, and of `rank` (later while it computes).
  TimePoint now() const { return now_; }
  TimePoint timeOf(int rank) const;
  // Adds `seconds` of work to the rank being turned (no effect outside a turn).
  void charge(double seconds);
  // `rank` waits until `until` (an answer from outside the network: the store's): its clock
  // reads no earlier, in a turn or before its next one.
  void waitUntil(int rank, TimePoint until);
  // Runs `call` (the turning rank's request to the store: Runtime::callOutside), where its waits
  // (waitUntil) call `meanwhile` every `every` of them, at that time: the beats a process sends
  // while its turning thread waits for the store's answer.
  void waitingFor(const std::function<void()>& call, const std::function<void()>& meanwhile,
                  std::chrono::nanoseconds every);
  int turning() const { return turning_; }

  // Asks for `rank` to be turned at `at` (no earlier than now).
  void wake(int rank, TimePoint at);
  void kill(int rank, TimePoint at) { kill(std::vector<int>{rank}, at); }
  void kill(const std::vector<int>& ranks, TimePoint at);
  void cut(int a, int b, TimePoint at);
  void partition(const std::vector<int>& side, TimePoint at);
  void stall(int rank, TimePoint from, TimePoint until);
  void slow(int rank, double factor);
  void slowLink(int host, double factor);
  // The rank's reductions (and the copies of its algorithms) take `factor` times as long, on
  // top of slow(): a progress thread that reduces on a core it shares.
  void slowReductions(int rank, double factor);
  // Adds `seconds` of reduction to the rank being turned.
  void chargeReduction(double seconds);
  // Keeps a copy of every message `rank` sends (tag and bytes) from now on, for a replay.
  void record(int rank) { recorded_ = rank; }
  struct Sent {
    int to;
    uint64_t tag;
    std::vector<char> bytes;
  };
  const std::vector<Sent>& recorded() const { return sentByRecorded_; }
  // Shared windows (SimNetworkSpec::windows): `rank` offers memory it allocated under a key
  // (returned); a rank of the same host finds it by key while some rank holds it (null where
  // not, or from another host, or with windows off).
  std::string offerWindow(int rank, const std::shared_ptr<char[]>& memory, size_t bytes);
  std::shared_ptr<char[]> findWindow(int rank, const std::string& key, size_t* bytes);
  // Puts that landed in memory no longer registered (SimTransport::land), over every rank.
  uint64_t strayPuts() const;
  bool dead(int rank) const { return dead_[rank]; }
  // Whether `rank` is stalled (not turned) now.
  bool stalled(int rank) const { return point(stallUntil_[rank]) > now_; }
  int deaths() const { return static_cast<int>(deadRanks_.size()); }
  const std::vector<int>& deadRanks() const { return deadRanks_; }  // in order of death
  // Whether a message from a to b would be dropped now (a cut or a partition between them).
  bool severed(int a, int b) const;

  // Handles events in time order until `done()` holds (checked after each event), the queue is
  // empty, or virtual time would pass `limit`. Returns whether done() held.
  bool run(const std::function<bool()>& done, TimePoint limit);
  // Handles the events until `until`, then is at `until` (if it was not later already).
  void advanceTo(TimePoint until);

  // Transport side.
  void send(int from, int to, uint64_t tag, const void* data, size_t bytes, Request* req);
  // A one-sided put of `bytes` at `offset` of `to`'s region `region`: it travels as a message
  // does, but on a lane of its own between the pair, three latencies longer (so a message sent
  // after it may arrive first, as over a NIC's RDMA engine), and lands on arrival with nothing
  // asked of `to`; `req` completes once the source may be reused. A flush is a mark that
  // follows `from`'s puts to `to` on their lane: answered once they have landed (a latency back),
  // never where the mark is lost (a dead or cut-off `to`: the transport fails it when it learns
  // `to` is lost, the op's deadline otherwise).
  void put(int from, int to, uint64_t region, size_t offset, const void* data, size_t bytes,
           Request* req);
  void flush(int from, int to, uint64_t id);
  void connected(int from, int to);

  // Counters.
  uint64_t messages() const { return messages_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t events() const { return events_; }
  // Messages whose tag slot is `slot` (e.g. the notices' slot).
  uint64_t messagesOfSlot(uint64_t slot) const;
  // Messages of one op: its group's id and its sequence number in the tag (data, call prints and
  // sizes; not the group's creation, heartbeats or notices); a wide group's (`wide` bits:
  // base/tag.h) under every id of its block.
  uint64_t messagesOfOp(uint32_t group, uint32_t sequence, int wide = 0) const;
  // A digest of every message delivered (time, sender, receiver, tag, size), in order.
  uint64_t digest() const { return digest_; }
  int endpoints(int rank) const;
  // The most any one link of `level` (0: a rank's port, 1: a NIC, 2: an uplink) has been booked
  // so far, in seconds, either way.
  double busiestLink(int level) const;

 private:
  enum class Kind : uint8_t {
    kArrive,
    kSent,
    kTurn,
    kKill,
    kLost,
    kCut,
    kPacket,
    kPartition,
    kStall,
    kFlushed
  };
  // 32 bytes (the calendar sorts hundreds of millions): the kind rides below the order made,
  // which alone breaks ties (no two events share it).
  struct Event {
    int64_t at;      // ns
    uint64_t order;  // order made << 8 | kind
    int rank;
    int other;
    uint64_t index;  // kArrive, kPacket: the message; kSent: the request's slot
    Kind kind() const { return static_cast<Kind>(order & 0xff); }
    bool operator>(const Event& e) const { return at != e.at ? at > e.at : order > e.order; }
  };
  struct Message;
  struct Cold;
  uint64_t newMessage(int from, int to, uint64_t tag, size_t bytes, Request* req);
  void launch(uint64_t index, int64_t at);  // after the pair's messages before it
  // Takes the next event out of the queue, and asks the cache for what the events a few places
  // behind it read first: their messages, and nearer, the first link of their next packets. At
  // tens of thousands of ranks the misses on them were most of a booking's time.
  void take();
  void push(int64_t at, Kind kind, int rank, int other = -1, uint64_t index = 0);
  int levelBetween(int a, int b) const;
  int64_t latencyNs(int level) const { return latencyNs_[level]; }
  int64_t overheadNs(int from, int to) const;  // a message's, each side
  int64_t overheadNs(const Message& m) const;
  void lose(int rank, int peer, int64_t at);  // `rank` learns `peer` is lost at `at`
  // Books the links of message `index`'s next packet from `at` (no earlier than now).
  void bookPacket(uint64_t index, int64_t at);
  // run()'s events that take more than a few lines: a message lands, a rank turns, ranks die.
  void onArrive(const Event& e);
  void onTurn(const Event& e);
  void onKill(const Event& e);
  static int64_t ns(TimePoint t) { return t.time_since_epoch().count(); }
  static TimePoint point(int64_t ns);

  SimNetworkSpec spec_;
  int64_t latencyNs_[3] = {}, overheadNs_[3] = {};  // by level, from spec_
  std::vector<SimTransport*> transports_;
  struct Window {
    std::weak_ptr<char[]> memory;
    size_t bytes;
    int host;
  };
  std::map<std::string, Window> windows_;  // offered, by key
  uint64_t nextWindowKey_ = 1;
  std::function<TimePoint(int)> turn_;
  SimCalendar<Event> queue_;
  uint64_t order_ = 0;
  TimePoint now_{};
  int turning_ = -1;
  int64_t local_ = 0;                                // the turning rank's time
  const std::function<void()>* waitHook_ = nullptr;  // waitingFor's `meanwhile`, while it runs
  int64_t waitEvery_ = 0;
  std::vector<int64_t> busyUntil_, turnAt_;
  std::vector<bool> dead_;
  std::vector<int> deadRanks_;
  std::set<std::pair<int, int>> cuts_;
  std::vector<int> side_;                   // by rank, once partitioned (0: the rest)
  std::vector<std::vector<int>> batches_;   // kKill, kPartition: the ranks, by event index
  std::vector<int64_t> stallUntil_;         // by rank (kStall: index the end)
  std::vector<double> slowRank_, slowNic_;  // factors, by rank and by host
  std::vector<double> slowReduce_;          // by rank
  int recorded_ = -1;
  std::vector<Sent> sentByRecorded_;
  std::vector<std::set<int>> endpointsOf_;  // by rank: the ranks it connected to
  // Links: per rank shared-memory out/in, per host NIC out/in, per rack uplink out/in.
  std::vector<SimLink> shmOut_, shmIn_, nicOut_, nicIn_, upOut_, upIn_;
  // A sender's receivers so far, by rank: when its last message to each arrives (keeps a pair's
  // order) and that pair's last message waiting for its turn to be booked.
  struct Pair {
    int to;
    int64_t lastArrival;
    uint64_t tail;
  };
  Pair& pair(int from, int to);  // `to` past the ranks: the one-sided lane to `to - size()`
  Pair& laneOf(const Message& m);
  std::vector<std::vector<Pair>> pairs_;  // by sender, sorted by receiver
  std::vector<Message> inFlight_;
  std::vector<Cold> cold_;  // by the same index
  std::vector<uint64_t> freeMessages_;
  std::vector<Request*> sends_;
  std::vector<uint64_t> freeSends_;
  uint64_t messages_ = 0, bytes_ = 0, events_ = 0, digest_ = 1469598103934665603ull;
  std::map<uint64_t, uint64_t> bySlot_;
  std::map<uint64_t, uint64_t> byOp_;  // by the tag's group and sequence fields
};

// A rank's clock: its virtual time (SimNetwork::timeOf).
class SimClock : public Clock {
 public:
  SimClock(const SimNetwork& network, int rank) : network_(network), rank_(rank) {}
  TimePoint now() const override { return network_.timeOf(rank_); }

 private:
  const SimNetwork& network_;
  int rank_;
};

// The Transport of one simulated rank. Matching follows UCX's rules, as the loopback's does.
class SimTransport : public Transport {
 public:
  SimTransport(SimNetwork* network, int rank) : network_(network), rank_(rank) {}

  std::string localAddress() override { return "sim:" + std::to_string(rank_); }
  PeerId connect(const std::string& address) override;
  void send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) override;
  void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  void cancel(Request* req) override;
  void discard(uint64_t tag, uint64_t mask) override;
  bool progress() override;
  bool arm() override { return true; }
  int wakeFd() override { return -1; }
  std::vector<std::pair<PeerId, std::string>> lostPeers() override;
  std::string name() const override { return "sim"; }
  size_t endpoints() const override { return peers_.size(); }
  std::string addressOf(PeerId peer) const override {
    return "sim:" + std::to_string(peers_.at(static_cast<size_t>(peer)));
  }

  // One-sided puts (Transport's): regions of this rank's memory, and peers' regions opened.
  uint64_t registerRegion(void* base, size_t bytes, std::string* key) override;
  uint64_t openRegion(PeerId peer, const std::string& key) override;
  void put(PeerId peer, uint64_t remote, size_t offset, const void* data, size_t bytes,
           Request* req) override;
  void flush(PeerId peer, Request* req) override;
  void closeRegion(uint64_t id) override;
  // Shared windows (Transport's), where the network has them (SimNetworkSpec::windows): heap
  // memory of the one process, mapped by the ranks of the owner's host.
  uint64_t allocateWindow(size_t bytes, void** base, std::string* key) override;
  uint64_t mapWindow(PeerId peer, const std::string& key, void** base, size_t* bytes) override;
  void releaseWindow(uint64_t id) override { windows_.erase(id); }

  // Network side.
  void arrive(Delivered message, int64_t overheadNs) {
    inbox_.push_back(std::move(message));
    inboxOverheadNs_ += overheadNs;
  }
  void sent(Request* req) { sentDone_.push_back(req); }
  void lost(int peerRank, const std::string& why);
  // A put arrived: written into the region now where it is registered and the bytes fit it;
  // dropped and counted (strayPuts) where not: a put that lands in memory let go.
  void land(uint64_t region, size_t offset, const std::vector<char>& bytes, size_t size);
  void flushed(uint64_t id);
  uint64_t strayPuts() const { return strayPuts_; }

 private:
  SimNetwork* network_;
  int rank_;
  std::vector<int> peers_;  // PeerId -> rank
  std::map<int, PeerId> byRank_;
  std::vector<Delivered> inbox_;
  int64_t inboxOverheadNs_ = 0;  // what taking the inbox in costs
  std::vector<Request*> sentDone_;
  std::vector<std::pair<PeerId, std::string>> lost_;
  TagMatcher matcher_;
  struct Region {
    char* base;
    size_t bytes;
  };
  std::map<uint64_t, Region> regions_;  // this rank's, by id
  struct Opened {
    int rank;
    uint64_t region;  // the peer's id for it
  };
  std::map<uint64_t, Opened> opened_;  // peers' regions, by the id handed out here
  uint64_t nextRegion_ = 1;
  struct Flush {
    int rank;
    Request* req;
  };
  std::map<uint64_t, Flush> flushes_;  // not answered yet, by id
  uint64_t nextFlush_ = 1;
  std::vector<Request*> flushesDone_;
  uint64_t strayPuts_ = 0;
  std::map<uint64_t, std::shared_ptr<char[]>> windows_;  // allocated and mapped, by id
  uint64_t nextWindow_ = 1;
};

}  // namespace ddl
