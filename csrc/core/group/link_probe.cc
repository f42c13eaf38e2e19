#include "link_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "../base/config.h"
#include "../base/types.h"
#include "bootstrap.h"
#include "communicator.h"

namespace ddl {
namespace {

constexpr int kPings = 8;
constexpr size_t kSmallBytes = 256 << 10;
constexpr size_t kLargeBytes = 4 << 20;
constexpr double kFastEnough = 0.010;  // seconds for kSmallBytes: then kLargeBytes is cheap too
// Point-to-point tags no user operation has used yet when a group is created.
constexpr uint32_t kPingTag = 0xfffffff0u, kDataTag = 0xfffffff1u, kAckTag = 0xfffffff2u;
// The host level: every host's ranks at once, as in a host stage.
constexpr uint32_t kTokenTag = 0xfffffff3u, kStepTag = 0xfffffff4u;
// The results, up and down the creation tree.
constexpr uint32_t kResultTag = 0xfffffff5u;
constexpr int kLaps = 5;                // token laps around the host ring
constexpr int kSteps = 5;               // ring steps of kStepBytes
constexpr size_t kStepBytes = 1 << 20;  // per rank and step
constexpr size_t kStepFloats = kStepBytes / sizeof(float);

using Clock = std::chrono::steady_clock;

// What this process measured, by "host:ranks" (a host level) or "host>host:dimension" (a link
// between two hosts): later groups over the same hosts reuse it instead of measuring again.
std::mutex rememberedMutex;
std::map<std::string, LinkCost> remembered;

std::optional<LinkCost> recall(const std::string& what) {
  std::lock_guard<std::mutex> lock(rememberedMutex);
  auto found = remembered.find(what);
  if (found == remembered.end()) return std::nullopt;
  return found->second;
}

void remember(const std::string& what, const LinkCost& cost) {
  std::lock_guard<std::mutex> lock(rememberedMutex);
  remembered[what] = cost;
}

void await(Communicator& comm, const std::shared_ptr<Work>& work) {
  if (!work->wait(comm.timeout())) {
    throw Error("ddl: probing the links of the group: " + work->description() +
                " timed out after " + std::to_string(comm.timeout().count()) + " ms");
  }
  if (work->failed()) throw Error("ddl: probing the links of the group: " + work->error());
}

double seconds(Clock::time_point from) {
  return std::chrono::duration<double>(Clock::now() - from).count();
}

// One transfer of `bytes` to `peer`, acknowledged: seconds from the send to the ack.
double transfer(Communicator& comm, int peer, std::vector<char>& data, size_t bytes) {
  char ack = 0;
  auto start = Clock::now();
  auto ackWork = comm.recv(&ack, 1, peer, kAckTag);
  await(comm, comm.send(data.data(), bytes, peer, kDataTag));
  await(comm, ackWork);
  return seconds(start);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `bytes` took `took` seconds, of which `latency` was waiting (left out unless it is most of it).
LinkCost measured(double latency, size_t bytes, double took) {
  const double wire = took - latency > took / 4 ? took - latency : took;
  return LinkCost{latency, static_cast<double>(bytes) / wire, "probed"};
}

// The figures of one probe, from the ranks that measured them to every rank, over the group's
// creation tree (bootstrap.h): up, the slowest of what a subtree measured (the largest latency,
// the smallest bandwidth); down, rank 0's answer. 2 (P - 1) messages of 16 bytes in 2 log2(P)
// rounds, and every rank waits for the answer, so the next probe meets quiet links. Nothing
// measured anywhere: nullopt on every rank.
std::optional<LinkCost> spread(Communicator& comm, const std::optional<LinkCost>& mine) {
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
  const int parent = bootstrapParent(comm.rank());
  const std::vector<int> children = bootstrapChildren(comm.rank(), comm.size());
  for (int child : children) {
    double theirs[2] = {0, 0};
    await(comm, comm.recv(theirs, sizeof(theirs), child, kResultTag));
    combine(theirs);
  }
  if (parent >= 0) {
    await(comm, comm.send(figures, sizeof(figures), parent, kResultTag));
    await(comm, comm.recv(figures, sizeof(figures), parent, kResultTag));
  }
  for (int child : children) await(comm, comm.send(figures, sizeof(figures), child, kResultTag));
  if (!(figures[1] > 0)) return std::nullopt;
  return LinkCost{figures[0], figures[1], "probed"};
}

// The measuring side; `known` (figures this process measured before for these two hosts): it
// only tells the responder so.
LinkCost measure(Communicator& comm, int peer, const std::optional<LinkCost>& known) {
  char mode = known ? 1 : 0;
  await(comm, comm.send(&mode, 1, peer, kPingTag));
  if (known) return *known;
  char ping = 0;
  std::vector<double> trips;
  for (int i = 0; i < kPings; ++i) {
    auto start = Clock::now();
    auto back = comm.recv(&ping, 1, peer, kPingTag);
    await(comm, comm.send(&ping, 1, peer, kPingTag));
    await(comm, back);
    trips.push_back(seconds(start));
  }
  const double trip = median(trips);
  std::vector<char> data(kLargeBytes);
  size_t bytes = kSmallBytes;
  double took = transfer(comm, peer, data, bytes);
  char more = took < kFastEnough ? 1 : 0;
  await(comm, comm.send(&more, 1, peer, kPingTag));
  if (more) {
    bytes = kLargeBytes;
    took = transfer(comm, peer, data, bytes);
  }
  LinkCost cost = measured(trip, bytes, took);
  cost.latency = trip / 2;
  return cost;
}

void respond(Communicator& comm, int peer) {
  char mode = 0;
  await(comm, comm.recv(&mode, 1, peer, kPingTag));
  if (mode != 0) return;
  char ping = 0;
  for (int i = 0; i < kPings; ++i) {
    await(comm, comm.recv(&ping, 1, peer, kPingTag));
    await(comm, comm.send(&ping, 1, peer, kPingTag));
  }
  std::vector<char> data(kLargeBytes);
  char ack = 1, more = 0;
  await(comm, comm.recv(data.data(), kSmallBytes, peer, kDataTag));
  await(comm, comm.send(&ack, 1, peer, kAckTag));
  await(comm, comm.recv(&more, 1, peer, kPingTag));
  if (more) {
    await(comm, comm.recv(data.data(), kLargeBytes, peer, kDataTag));
    await(comm, comm.send(&ack, 1, peer, kAckTag));
  }
}

// The host level, on this rank's host ring `ring` (its host's ranks in rank order, at least 2):
// the figures its first rank measured (the others return nothing). Latency: a token's laps,
// per step. Bandwidth: ring steps in which every rank sends kStepBytes to the next, receives as
// much from the previous and adds it to its own, as a host stage's reduce-scatter does.
// A first lap whose token is 1 says the first rank knows the figures (`known`): no more.
std::optional<LinkCost> measureHost(Communicator& comm, const std::vector<int>& ring,
                                    const std::optional<LinkCost>& known) {
  const int n = static_cast<int>(ring.size());
  const int at = static_cast<int>(std::find(ring.begin(), ring.end(), comm.rank()) - ring.begin());
  const int next = ring[(at + 1) % n], prev = ring[(at + n - 1) % n];
  const bool first = at == 0;
  uint64_t token = first && known ? 1 : 0;
  std::vector<double> laps;
  for (int lap = 0; lap < kLaps; ++lap) {
    auto start = Clock::now();
    if (first) {
      await(comm, comm.send(&token, sizeof(token), next, kTokenTag));
      await(comm, comm.recv(&token, sizeof(token), prev, kTokenTag));
      laps.push_back(seconds(start) / n);
    } else {
      await(comm, comm.recv(&token, sizeof(token), prev, kTokenTag));
      await(comm, comm.send(&token, sizeof(token), next, kTokenTag));
    }
    if (token != 0) return first ? known : std::nullopt;
  }
  std::vector<float> mine(kStepFloats, 1.0f), theirs(kStepFloats);
  std::vector<double> steps;
  for (int step = 0; step < kSteps; ++step) {
    auto start = Clock::now();
    auto in = comm.recv(theirs.data(), kStepBytes, prev, kStepTag);
    auto out = comm.send(mine.data(), kStepBytes, next, kStepTag);
    await(comm, in);
    for (size_t i = 0; i < kStepFloats; ++i) mine[i] += theirs[i];
    await(comm, out);
    steps.push_back(seconds(start));
  }
  if (!first) return std::nullopt;
  return measured(median(laps), kStepBytes, median(steps));
}

void probeHosts(Communicator& comm, const Topology& topology, LinkCosts* links) {
  if (links->at(0).origin != "default") return;
  const std::vector<std::vector<int>> hosts = topology.members(0);
  const std::vector<int>& mine = hosts[topology.levels[0].blockOf[comm.rank()]];
  std::optional<LinkCost> measuredHere;
  if (mine.size() > 1) {
    const int host = topology.levels[0].blockOf[comm.rank()];
    const std::string what =
        topology.levels[0].blockNames[host] + ":" + std::to_string(mine.size());
    const std::optional<LinkCost> known = mine[0] == comm.rank() ? recall(what) : std::nullopt;
    measuredHere = measureHost(comm, mine, known);
    if (measuredHere) remember(what, *measuredHere);
  }
  // Every rank plans with the slowest host's figures: a stage ends when its last host is done.
  if (std::optional<LinkCost> worst = spread(comm, measuredHere)) {
    links->byDimension[0] = *worst;
  }
}

}  // namespace

void probeLinks(Communicator& comm, const Topology& topology, LinkCosts* links) {
  if (!config().probeLinks || topology.hosts() < 2) return;
  probeHosts(comm, topology, links);
  const Grid grid = gridOf(topology);
  for (int d = 1; d < static_cast<int>(grid.dims.size()); ++d) {
    if (grid.dims[d] < 2 || links->at(d).origin != "default") continue;
    std::vector<std::vector<int>> rings = dimensionRings(topology, grid, d);
    if (rings.empty()) continue;
    const int measurer = rings[0][0], responder = rings[0][1];
    std::optional<LinkCost> measuredHere;
    if (comm.rank() == measurer) {
      const auto& names = topology.levels[0].blockNames;
      const auto& hostOf = topology.levels[0].blockOf;
      const std::string what =
          names[hostOf[measurer]] + ">" + names[hostOf[responder]] + ":" + std::to_string(d);
      measuredHere = measure(comm, responder, recall(what));
      remember(what, *measuredHere);
    } else if (comm.rank() == responder) {
      respond(comm, measurer);
    }
    const std::optional<LinkCost> cost = spread(comm, measuredHere);
    if (!cost) {
      throw Error("ddl: the link probe of dimension " + std::to_string(d) + " measured nothing");
    }
    if (static_cast<int>(links->byDimension.size()) <= d) {
      links->byDimension.resize(d + 1, links->byDimension.back());
    }
    links->byDimension[d] = *cost;
  }
}

}  // namespace ddl
