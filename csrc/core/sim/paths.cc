#include "paths.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <utility>

#include "../base/tag.h"

namespace ddl {

double micros(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

TimePoint after(TimePoint t, double us) {
  return t + std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::duration<double, std::micro>(us));
}

bool among(const std::vector<int>& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

WindowRounds::Broken WindowRounds::run() {
  n_ = cluster_.size();
  count_ = s_.windows;
  k_ = s_.windowFloats;
  sent_.assign(count_, std::vector<std::vector<int>>(n_ * n_));
  taken_.assign(count_, std::vector<int>(n_ * n_, 0));
  if (!create() || !attach()) return broken_;
  for (int round = 0; round < s_.windowRounds; ++round) {
    if (round > 0 && round == s_.windowRounds / 2) {  // deregister and register anew
      if (!drain() || !detach(1000.0f + round) || !attach()) return broken_;
    }
    if (!exchange(round)) return broken_;
  }
  if (!drain() || !detach(2000.0f)) return broken_;
  windows_.clear();  // destroyed with nothing in flight
  cluster_.runUntil([] { return false; }, std::chrono::milliseconds(1));
  return broken_;
}

void WindowRounds::broke(std::string& what, const std::string& why) {
  if (what.empty()) what = why;
}

bool WindowRounds::failedOn(const char* what, int r, const std::string& why) {
  broke(broken_.unnamed, std::string("windows: ") + what + " failed on rank " + std::to_string(r) +
                             " with no fault struck: " + why);
  return false;
}

bool WindowRounds::awaitAll(const std::vector<std::shared_ptr<Work>>& works,
                            const std::string& what) {
  const auto limit = s_.cluster.timeout + kGrace;
  cluster_.runUntil(
      [&] {
        for (const auto& w : works) {
          if (w && !w->done()) return false;
        }
        return true;
      },
      limit);
  for (size_t i = 0; i < works.size(); ++i) {
    if (works[i] && !works[i]->done()) {
      broke(broken_.hang, "windows: " + what + " did not end (" + std::to_string(i) + ")");
      return false;
    }
  }
  return true;
}

// Made at once: every rank starts each creation before any ends.
bool WindowRounds::create() {
  std::vector<Communicator*> members = cluster_.members();
  std::vector<std::vector<Window::Creating>> creating(n_);
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n_; ++r) {
    for (int w = 0; w < count_; ++w) {
      creating[r].push_back(Window::startCreate(*members[r]));
      works.push_back(creating[r].back().work);
    }
  }
  if (!awaitAll(works, "creation")) return false;
  windows_.assign(n_, {});
  for (int r = 0; r < n_; ++r) {
    for (int w = 0; w < count_; ++w) {
      try {
        windows_[r].push_back(Window::finishCreate(creating[r][w]));
      } catch (const std::exception& e) {
        return failedOn("creation", r, e.what());
      }
    }
    if (count_ == 2 && windows_[r][0]->id() == windows_[r][1]->id()) {
      broke(broken_.wrong,
            "windows: two made at once share the id " + std::to_string(windows_[r][0]->id()));
      return false;
    }
  }
  return true;
}

// Each rank's memory: a block of k floats for each peer, stamped with the round that put it.
bool WindowRounds::attach() {
  mine_.assign(n_, std::vector<std::vector<float>*>(count_));
  std::vector<std::unique_ptr<Window::Attaching>> attaching;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n_; ++r) {
    for (int w = 0; w < count_; ++w) {
      memory_.push_back(std::make_unique<std::vector<float>>(n_ * k_, 0.0f));
      mine_[r][w] = memory_.back().get();
      WindowMemory m;
      m.data = mine_[r][w]->data();
      m.bytes = n_ * k_ * sizeof(float);
      m.layout = "float32 [" + std::to_string(n_ * k_) + "]";
      attaching.push_back(windows_[r][w]->startAttach(m));
      works.push_back(attaching.back()->work);
    }
  }
  if (!awaitAll(works, "tensor_register")) return false;
  for (int i = 0; i < static_cast<int>(attaching.size()); ++i) {
    try {
      windows_[i / count_][i % count_]->finishAttach(*attaching[i]);
    } catch (const std::exception& e) {
      return failedOn("tensor_register", i / count_, e.what());
    }
  }
  return true;
}

// Deregistration, with a put of each rank's still on its way (no signal covers it): it has
// landed once tensor_deregister returns, and nothing lands after.
bool WindowRounds::detach(float stamp) {
  std::vector<std::unique_ptr<Window::Detaching>> detaching;
  for (int r = 0; r < n_; ++r) {
    for (int w = 0; w < count_; ++w) {
      memory_.push_back(std::make_unique<std::vector<float>>(k_, stamp));
      windows_[r][w]->put(memory_.back()->data(), k_ * sizeof(float), (r + 1) % n_,
                          r * k_ * sizeof(float));
      detaching.push_back(windows_[r][w]->startDetach());
    }
  }
  std::vector<bool> finished(detaching.size(), false);
  for (int step = 0; step < 2; ++step) {  // the flush, then the barrier
    std::vector<std::shared_ptr<Work>> pending;
    for (const auto& d : detaching) pending.push_back(Window::pending(*d));
    if (!awaitAll(pending, "tensor_deregister")) return false;
    for (size_t i = 0; i < detaching.size(); ++i) {
      if (finished[i]) continue;
      try {
        finished[i] = windows_[i / count_][i % count_]->stepDetach(*detaching[i]);
      } catch (const std::exception& e) {
        return failedOn("tensor_deregister", static_cast<int>(i / count_), e.what());
      }
    }
  }
  for (int r = 0; r < n_; ++r) {
    for (int w = 0; w < count_; ++w) {
      const std::vector<float>& target = *mine_[(r + 1) % n_][w];
      if (target[r * k_] != stamp || target[r * k_ + k_ - 1] != stamp) {
        broke(broken_.wrong, "windows: rank " + std::to_string(r) + "'s put to rank " +
                                 std::to_string((r + 1) % n_) +
                                 " had not landed when tensor_deregister returned");
        return false;
      }
    }
  }
  return true;
}

// A wait of `r` for `from` that returned: the put its signal covers is there.
void WindowRounds::checkWait(int w, int r, int from) {
  const int c = taken_[w][r * n_ + from]++;
  const std::vector<int>& rounds = sent_[w][from * n_ + r];
  if (c >= static_cast<int>(rounds.size())) {
    return broke(broken_.wrong, "windows: rank " + std::to_string(r) + "'s wait for rank " +
                                    std::to_string(from) + " returned with no signal sent");
  }
  const float want = static_cast<float>(rounds[c] + 1);
  const std::vector<float>& mem = *mine_[r][w];
  if (mem[from * k_] < want || mem[from * k_ + k_ - 1] < want) {
    ++broken_.earlySignals;
    broke(broken_.wrong, "windows: rank " + std::to_string(r) + "'s wait for rank " +
                             std::to_string(from) + " returned before the put of round " +
                             std::to_string(rounds[c]) + " landed (it reads " +
                             std::to_string(mem[from * k_]) + ")");
  }
}

// Every signal sent and not yet taken is waited for, and checked.
bool WindowRounds::drain() {
  std::vector<std::shared_ptr<Work>> waits;
  std::vector<std::array<int, 3>> of;  // w, r, from
  for (int w = 0; w < count_; ++w) {
    for (int r = 0; r < n_; ++r) {
      for (int from = 0; from < n_; ++from) {
        const int left =
            static_cast<int>(sent_[w][from * n_ + r].size()) - taken_[w][r * n_ + from];
        for (int i = 0; i < left; ++i) {
          waits.push_back(windows_[r][w]->waitSignal(from));
          of.push_back({w, r, from});
        }
      }
    }
  }
  if (!awaitAll(waits, "a wait for a signal sent")) return false;
  for (size_t i = 0; i < waits.size(); ++i) {
    if (waits[i]->failed()) {
      return failedOn("a wait for a signal sent", of[i][1], waits[i]->status().detail);
    }
    checkWait(of[i][0], of[i][1], of[i][2]);
  }
  return true;
}

// A round: every rank puts into the peer `d` after it and signals it (but the late rank, in
// the late round), and waits for the peer `d` before it (50 ms in the late round: the late
// rank's peer times out, naming it); then the late rank signals, for a later wait to take.
bool WindowRounds::exchange(int round) {
  const int late = s_.lateSignaler, d = 1 + round % (n_ - 1);
  const bool lateRound = round == s_.lateRound;
  std::vector<std::shared_ptr<Work>> works;
  struct Wait {
    std::shared_ptr<Work> work;
    int w, r, from;
  };
  std::vector<Wait> waits;
  for (int r = 0; r < n_; ++r) {
    const int to = (r + d) % n_, from = (r - d + n_) % n_;
    for (int w = 0; w < count_; ++w) {
      memory_.push_back(std::make_unique<std::vector<float>>(k_, static_cast<float>(round + 1)));
      works.push_back(windows_[r][w]->put(memory_.back()->data(), k_ * sizeof(float), to,
                                          r * k_ * sizeof(float)));
      if (r != late || !lateRound) {
        works.push_back(windows_[r][w]->signal(to));
        sent_[w][r * n_ + to].push_back(round);
      }
      CallOptions options;
      if (lateRound) options.timeout = std::chrono::milliseconds(50);
      waits.push_back(Wait{windows_[r][w]->waitSignal(from, options), w, r, from});
    }
  }
  const size_t posted = works.size();
  for (const Wait& wait : waits) works.push_back(wait.work);
  if (!awaitAll(works, "round " + std::to_string(round))) return false;
  for (size_t i = 0; i < posted; ++i) {
    if (works[i]->failed()) return failedOn("a put or signal", -1, works[i]->status().detail);
  }
  for (const Wait& wait : waits) {
    if (!wait.work->failed()) {
      checkWait(wait.w, wait.r, wait.from);
      continue;
    }
    const Status& status = wait.work->status();
    const bool named = status.kind == StatusKind::kTimeout &&
                       (among(status.ranks, late) ||
                        status.detail.find("rank " + std::to_string(late)) != std::string::npos);
    if (!lateRound || wait.from != late || !named) {
      return failedOn("wait_signal", wait.r,
                      std::string(statusKindName(status.kind)) + ": " + status.detail);
    }
  }
  if (!lateRound) return true;
  std::vector<std::shared_ptr<Work>> signals;
  const int to = (late + d) % n_;
  for (int w = 0; w < count_; ++w) {
    signals.push_back(windows_[late][w]->signal(to));
    sent_[w][late * n_ + to].push_back(round);
  }
  return awaitAll(signals, "the late signals");
}

void sendHostile(SimCluster& cluster, const Scenario& s,
                 std::vector<std::unique_ptr<Request>>* requests) {
  SimNetwork& net = cluster.network();
  const int n = cluster.size(), h = s.hostile;
  Communicator& comm = cluster.comm(h);
  const uint32_t group = comm.id();
  const auto sequence = static_cast<uint32_t>(comm.sequenceNumber());
  uint64_t state = s.seed ^ 0x6a09e667f3bcc909ull;
  auto junk = [&](size_t bytes) {
    std::string out(bytes, '\0');
    for (char& c : out) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      c = static_cast<char>(state >> 56);
    }
    return out;
  };
  auto send = [&](int to, uint64_t tag, const std::string& bytes) {
    if (to == h || net.dead(to)) return;
    requests->push_back(std::make_unique<Request>());
    net.send(h, to, tag, bytes.data(), bytes.size(), requests->back().get());
  };
  const int sends = s.hostileSends;
  if (sends & Scenario::kReplays) {
    // (But for its point-to-point messages: they carry their user's tag and no op's number, so
    // a copy on a live group is a send of that tag, which the receiver takes as the next, as
    // gloo's would; what a rank sends is its own to choose.)
    const std::vector<SimNetwork::Sent> before = net.recorded();
    for (const SimNetwork::Sent& m : before) {
      const uint32_t phase = static_cast<uint32_t>((m.tag >> (tag::kSlotShift + tag::kStepBits)) &
                                                   ((1u << tag::kPhaseBits) - 1));
      if (phase >= tag::kPointToPointPhase) continue;
      send(m.to, m.tag, std::string(m.bytes.begin(), m.bytes.end()));
    }
  }
  const int next = (h + 1) % n, prev = (h + n - 1) % n;
  using tag::kControlPhase;
  const uint64_t print = tag::make(group, sequence, tag::slot(kControlPhase, tag::kPrintStep), h);
  const uint64_t notice = tag::make(group, sequence, tag::slot(kControlPhase, tag::kNoticeStep), h);
  const uint64_t agreement =
      tag::make(tag::kAgreementGroup, sequence, tag::slot(kControlPhase, tag::kAgreementStep), h);
  const uint64_t abort = tag::make(tag::kAgreementGroup, sequence,
                                   tag::slot(kControlPhase, tag::kAgreementAbortStep), h);
  const uint64_t heartbeat =
      tag::make(tag::kAgreementGroup, 0, tag::slot(kControlPhase, tag::kHeartbeatStep), h);
  if (sends & Scenario::kPrints) {
    send(next, print, junk(3));
    send(next, print, junk(4096));
  }
  for (int to : {prev, next}) {
    if (!(sends & Scenario::kControl)) break;
    send(to, notice, junk(1));
    send(to, notice, junk(40));
    send(to, notice, junk(70000));
    send(to, agreement, junk(64));
    send(to, abort, junk(5));
    send(to, heartbeat, junk(7));
  }
  for (uint32_t step = 0; step < 2 && (sends & Scenario::kData); ++step) {
    send(next, tag::make(group, sequence, tag::slot(0, step), h), junk(5));
    // Block sizes of Bruck's all_to_all (one size for every block, or a few), any of them huge.
    send(next, tag::make(group, sequence, tag::slot(kControlPhase, tag::kSizesStep + step), h),
         junk(8 + 16 * step));
  }
}

namespace {

// The (gone, witness) group ranks `status`'s words name as news passed on names them.
std::vector<std::pair<int, int>> countedGoneBy(const Status& status) {
  std::vector<std::pair<int, int>> pairs;
  const std::string& s = status.detail;
  const std::string gone = " is gone: rank ";
  for (size_t at = s.find(gone); at != std::string::npos; at = s.find(gone, at + 1)) {
    // "rank G is gone: rank W counts it gone", or "... rank W reports: rank G is gone".
    const size_t g = s.rfind("rank ", at);
    const size_t w = at + gone.size();
    const size_t after = s.find_first_not_of("0123456789", w);
    if (g == std::string::npos || after == std::string::npos || after == w) continue;
    const int gr = std::atoi(s.c_str() + g + 5);
    const std::string again = " reports: rank " + std::to_string(gr) + " is gone";
    if (s.compare(after, 15, " counts it gone") == 0 ||
        s.compare(after, again.size(), again) == 0) {
      pairs.emplace_back(gr, std::atoi(s.c_str() + w));
    }
  }
  return pairs;
}

// Whether cut, partition or stall `f` kept ranks a and b apart: on the two sides, or one stalled.
bool separates(const Fault& f, int a, int b) {
  switch (f.kind) {
    case Fault::Kind::kCut:
      return (f.ranks[0] == a && f.ranks[1] == b) || (f.ranks[0] == b && f.ranks[1] == a);
    case Fault::Kind::kPartition:
      return among(f.ranks, a) != among(f.ranks, b);
    case Fault::Kind::kStall:
      return f.ranks[0] == a || f.ranks[0] == b;
    default:
      return false;
  }
}

}  // namespace

bool keptFromWitness(const Fault& f, const Status& status, const std::vector<int>& clusterOf) {
  const int n = static_cast<int>(clusterOf.size());
  for (auto [gone, witness] : countedGoneBy(status)) {
    if (gone < 0 || witness < 0 || gone >= n || witness >= n) continue;
    if (separates(f, clusterOf[gone], clusterOf[witness])) return true;
  }
  return false;
}

bool namesRank(const Status& status, int rank, const std::vector<int>& clusterOf) {
  for (int q : status.ranks) {
    if (q >= 0 && q < static_cast<int>(clusterOf.size()) && clusterOf[q] == rank) return true;
  }
  const std::string named = "rank " + std::to_string(rank);
  for (size_t at = status.detail.find(named); at != std::string::npos;
       at = status.detail.find(named, at + 1)) {
    const size_t end = at + named.size();
    if (end == status.detail.size() ||
        !std::isdigit(static_cast<unsigned char>(status.detail[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace ddl
