#include "link_probe.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "../base/config.h"
#include "../base/tag.h"
#include "../base/types.h"
#include "../runtime/runtime.h"
#include "bootstrap.h"
#include "engine.h"

namespace ddl {
namespace {

constexpr int kPings = 8;
constexpr size_t kSmallBytes = 256 << 10;
constexpr size_t kLargeBytes = 4 << 20;
constexpr double kFastEnough = 0.010;  // seconds for kSmallBytes: then kLargeBytes is cheap too
// Slots of the creation op's sequence, one per kind of message (a pair's messages of one slot
// arrive in the order sent).
constexpr uint64_t kPingSlot = tag::slot(tag::kControlPhase, tag::kProbeStep);
constexpr uint64_t kDataSlot = tag::slot(tag::kControlPhase, tag::kProbeStep + 1);
constexpr uint64_t kAckSlot = tag::slot(tag::kControlPhase, tag::kProbeStep + 2);
// The host level: every host's ranks at once, as in a host stage.
constexpr uint64_t kTokenSlot = tag::slot(tag::kControlPhase, tag::kProbeStep + 3);
constexpr uint64_t kStepSlot = tag::slot(tag::kControlPhase, tag::kProbeStep + 4);
// The results, up and down the creation tree.
constexpr uint64_t kResultSlot = tag::slot(tag::kControlPhase, tag::kProbeStep + 5);
static_assert(tag::kProbeSteps == 6);
constexpr int kLaps = 5;                // token laps around the host ring
constexpr int kSteps = 5;               // ring steps of kStepBytes
constexpr size_t kStepBytes = 1 << 20;  // per rank and step
constexpr size_t kStepFloats = kStepBytes / sizeof(float);

double seconds(const Op& op, TimePoint from) {
  return std::chrono::duration<double>(op.group().runtime->clock().now() - from).count();
}

TimePoint now(const Op& op) { return op.group().runtime->clock().now(); }

Task exchange(Op& op, Request* first, Request* second = nullptr) {
  if (second == nullptr) {
    co_await op.all(first);
  } else {
    co_await op.all(first, second);
  }
  op.recycle(first);
  op.recycle(second);
}

Task sendTo(Op& op, int peer, uint64_t slot, const void* data, size_t bytes) {
  co_await exchange(op, op.send(peer, slot, data, bytes));
}

Task receiveFrom(Op& op, int peer, uint64_t slot, void* data, size_t bytes) {
  co_await exchange(op, op.recv(peer, slot, data, bytes));
}

// One transfer of `bytes` to `peer`, acknowledged: seconds from the send to the ack.
Task transfer(Op& op, int peer, std::vector<char>* data, size_t bytes, double* took) {
  char ack = 0;
  const TimePoint start = now(op);
  Request* back = op.recv(peer, kAckSlot, &ack, 1);
  co_await exchange(op, op.send(peer, kDataSlot, data->data(), bytes), back);
  *took = seconds(op, start);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `bytes` took `took` seconds, of which `latency` was waiting (left out unless it is most of it).
LinkCost measured(double latency, size_t bytes, double took) {
  const double wire = took - latency > took / 4 ? took - latency : took;
  return LinkCost{latency, static_cast<double>(bytes) / wire, 0, "probed"};
}

// Dimension d's latency and bandwidth as measured; its overhead a message stays what it was (a
// probe's round trip holds it, but not apart from the latency).
void setMeasured(LinkCosts& links, int d, const LinkCost& cost) {
  if (static_cast<int>(links.byDimension.size()) <= d) {
    links.byDimension.resize(d + 1, links.byDimension.back());
  }
  const double overhead = links.byDimension[d].overhead;
  links.byDimension[d] = cost;
  links.byDimension[d].overhead = overhead;
}

// The figures of one probe, from the ranks that measured them to every rank, over the group's
// creation tree (bootstrap.h): up, the slowest of what a subtree measured (the largest latency,
// the smallest bandwidth); down, rank 0's answer. 2 (P - 1) messages of 16 bytes in 2 log2(P)
// rounds, and every rank waits for the answer, so the next probe meets quiet links. Nothing
// measured anywhere: nullopt on every rank.
Task spread(Op& op, std::optional<LinkCost> mine, std::optional<LinkCost>* out) {
  double figures[2] = {0, 0};  // latency, bandwidth (0: nothing measured)
  auto combine = [&figures](const double other[2]) {
    if (!(other[1] > 0)) return;
    if (!(figures[1] > 0)) {
      figures[0] = other[0];
      figures[1] = other[1];
      return;
    }
    figures[0] = std::max(figures[0], other[0]);
    figures[1] = std::min(figures[1], other[1]);
  };
  if (mine) {
    const double own[2] = {mine->latency, mine->bandwidth};
    combine(own);
  }
  const int parent = bootstrapParent(op.rank());
  const std::vector<int> children = bootstrapChildren(op.rank(), op.size());
  for (int child : children) {
    double theirs[2] = {0, 0};
    co_await receiveFrom(op, child, kResultSlot, theirs, sizeof(theirs));
    combine(theirs);
  }
  if (parent >= 0) {
    co_await sendTo(op, parent, kResultSlot, figures, sizeof(figures));
    co_await receiveFrom(op, parent, kResultSlot, figures, sizeof(figures));
  }
  for (int child : children) co_await sendTo(op, child, kResultSlot, figures, sizeof(figures));
  *out = figures[1] > 0 ? std::optional<LinkCost>(LinkCost{figures[0], figures[1], 0, "probed"})
                        : std::nullopt;
}

// The measuring side; `known` (figures this process measured before for these two hosts): it
// only tells the responder so.
Task measure(Op& op, int peer, std::optional<LinkCost> known, LinkCost* out) {
  char mode = known ? 1 : 0;
  co_await sendTo(op, peer, kPingSlot, &mode, 1);
  if (known) {
    *out = *known;
    co_return;
  }
  char ping = 0;
  std::vector<double> trips;
  for (int i = 0; i < kPings; ++i) {
    const TimePoint start = now(op);
    Request* back = op.recv(peer, kPingSlot, &ping, 1);
    co_await exchange(op, op.send(peer, kPingSlot, &ping, 1), back);
    trips.push_back(seconds(op, start));
  }
  const double trip = median(trips);
  std::vector<char> data(kLargeBytes);
  size_t bytes = kSmallBytes;
  double took = 0;
  co_await transfer(op, peer, &data, bytes, &took);
  char more = took < kFastEnough ? 1 : 0;
  co_await sendTo(op, peer, kPingSlot, &more, 1);
  if (more) {
    bytes = kLargeBytes;
    co_await transfer(op, peer, &data, bytes, &took);
  }
  *out = measured(trip, bytes, took);
  out->latency = trip / 2;
}

Task respond(Op& op, int peer) {
  char mode = 0;
  co_await receiveFrom(op, peer, kPingSlot, &mode, 1);
  if (mode != 0) co_return;
  char ping = 0;
  for (int i = 0; i < kPings; ++i) {
    co_await receiveFrom(op, peer, kPingSlot, &ping, 1);
    co_await sendTo(op, peer, kPingSlot, &ping, 1);
  }
  std::vector<char> data(kLargeBytes);
  char ack = 1, more = 0;
  co_await receiveFrom(op, peer, kDataSlot, data.data(), kSmallBytes);
  co_await sendTo(op, peer, kAckSlot, &ack, 1);
  co_await receiveFrom(op, peer, kPingSlot, &more, 1);
  if (more) {
    co_await receiveFrom(op, peer, kDataSlot, data.data(), kLargeBytes);
    co_await sendTo(op, peer, kAckSlot, &ack, 1);
  }
}

// The host level, on this rank's host ring `ring` (its host's ranks in rank order, at least 2):
// the figures its first rank measured (the others get nothing). Latency: a token's laps, per
// step. Bandwidth: ring steps in which every rank sends kStepBytes to the next, receives as much
// from the previous and adds it to its own, as a host stage's reduce-scatter does. A first lap
// whose token is 1 says the first rank knows the figures (`known`): no more.
Task measureHost(Op& op, std::vector<int> ring, std::optional<LinkCost> known,
                 std::optional<LinkCost>* out) {
  const int n = static_cast<int>(ring.size());
  const int at = static_cast<int>(std::find(ring.begin(), ring.end(), op.rank()) - ring.begin());
  const int next = ring[(at + 1) % n], prev = ring[(at + n - 1) % n];
  const bool first = at == 0;
  uint64_t token = first && known ? 1 : 0;
  std::vector<double> laps;
  for (int lap = 0; lap < kLaps; ++lap) {
    const TimePoint start = now(op);
    if (first) {
      co_await sendTo(op, next, kTokenSlot, &token, sizeof(token));
      co_await receiveFrom(op, prev, kTokenSlot, &token, sizeof(token));
      laps.push_back(seconds(op, start) / n);
    } else {
      co_await receiveFrom(op, prev, kTokenSlot, &token, sizeof(token));
      co_await sendTo(op, next, kTokenSlot, &token, sizeof(token));
    }
    if (token != 0) {
      *out = first ? known : std::nullopt;
      co_return;
    }
  }
  std::vector<float> mine(kStepFloats, 1.0f), theirs(kStepFloats);
  std::vector<double> steps;
  for (int step = 0; step < kSteps; ++step) {
    const TimePoint start = now(op);
    Request* in = op.recv(prev, kStepSlot, theirs.data(), kStepBytes);
    Request* sent = op.send(next, kStepSlot, mine.data(), kStepBytes);
    co_await op.all(in);
    for (size_t i = 0; i < kStepFloats; ++i) mine[i] += theirs[i];
    co_await exchange(op, in, sent);
    steps.push_back(seconds(op, start));
  }
  *out = first ? std::optional<LinkCost>(measured(median(laps), kStepBytes, median(steps)))
               : std::nullopt;
}

Task probeHosts(Op& op, Engine& engine, const Topology& topology, LinkCosts* links) {
  if (links->at(0).origin != "default") co_return;
  const std::vector<std::vector<int>> hosts = topology.members(0);
  const int host = topology.levels[0].blockOf(op.rank());
  const std::vector<int>& mine = hosts[host];
  std::optional<LinkCost> measuredHere;
  if (mine.size() > 1) {
    const std::string what = topology.levels[0].blockName(host) + ":" + std::to_string(mine.size());
    const std::optional<LinkCost> known =
        mine[0] == op.rank() ? engine.recallLink(what) : std::nullopt;
    co_await measureHost(op, mine, known, &measuredHere);
    if (measuredHere) engine.rememberLink(what, *measuredHere);
  }
  // Every rank plans with the slowest host's figures: a stage ends when its last host is done.
  std::optional<LinkCost> worst;
  co_await spread(op, measuredHere, &worst);
  if (worst) setMeasured(*links, 0, *worst);
}

}  // namespace

bool linksToProbe(const Config& settings, const Topology& topology, const LinkCosts& links) {
  if (!settings.probeLinks || topology.hosts() < 2) return false;
  if (links.at(0).origin == "default") return true;
  const std::vector<int> dims = gridDims(topology);
  for (int d = 1; d < static_cast<int>(dims.size()); ++d) {
    if (dims[d] >= 2 && links.at(d).origin == "default") return true;
  }
  return false;
}

Task probeLinks(Op& op, Engine& engine, const Topology& topology, LinkCosts* links) {
  if (!linksToProbe(engine.config(), topology, *links)) co_return;
  co_await probeHosts(op, engine, topology, links);
  const std::vector<int> dims = gridDims(topology);
  std::optional<Grid> grid;  // the whole machine's coordinates, O(P): only to probe
  for (int d = 1; d < static_cast<int>(dims.size()); ++d) {
    if (dims[d] < 2 || links->at(d).origin != "default") continue;
    if (!grid) grid = gridOf(topology);
    std::vector<std::vector<int>> rings = dimensionRings(topology, *grid, d);
    if (rings.empty()) continue;
    const int measurer = rings[0][0], responder = rings[0][1];
    std::optional<LinkCost> measuredHere;
    if (op.rank() == measurer) {
      const Level& hosts = topology.levels[0];
      const std::string what = hosts.blockName(hosts.blockOf(measurer)) + ">" +
                               hosts.blockName(hosts.blockOf(responder)) + ":" + std::to_string(d);
      LinkCost cost;
      co_await measure(op, responder, engine.recallLink(what), &cost);
      engine.rememberLink(what, cost);
      measuredHere = cost;
    } else if (op.rank() == responder) {
      co_await respond(op, measurer);
    }
    std::optional<LinkCost> cost;
    co_await spread(op, measuredHere, &cost);
    if (!cost) {
      throw Error("ddl: the link probe of dimension " + std::to_string(d) + " measured nothing");
    }
    setMeasured(*links, d, *cost);
  }
}

}  // namespace ddl
