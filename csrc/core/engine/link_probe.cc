#include "link_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "../types.h"
#include "communicator.h"
#include "config.h"

namespace ddl {
namespace {

constexpr int kPings = 8;
constexpr size_t kSmallBytes = 256 << 10;
constexpr size_t kLargeBytes = 4 << 20;
constexpr double kFastEnough = 0.010;  // seconds for kSmallBytes: then kLargeBytes is cheap too
// Point-to-point tags no user operation has used yet when a group is created.
constexpr uint32_t kPingTag = 0xfffffff0u, kDataTag = 0xfffffff1u, kAckTag = 0xfffffff2u;

using Clock = std::chrono::steady_clock;

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

LinkCost measure(Communicator& comm, int peer) {
  char ping = 0;
  std::vector<double> trips;
  for (int i = 0; i < kPings; ++i) {
    auto start = Clock::now();
    auto back = comm.recv(&ping, 1, peer, kPingTag);
    await(comm, comm.send(&ping, 1, peer, kPingTag));
    await(comm, back);
    trips.push_back(seconds(start));
  }
  std::sort(trips.begin(), trips.end());
  const double trip = trips[trips.size() / 2];
  std::vector<char> data(kLargeBytes);
  size_t bytes = kSmallBytes;
  double took = transfer(comm, peer, data, bytes);
  char more = took < kFastEnough ? 1 : 0;
  await(comm, comm.send(&more, 1, peer, kPingTag));
  if (more) {
    bytes = kLargeBytes;
    took = transfer(comm, peer, data, bytes);
  }
  const double wire = took - trip > took / 4 ? took - trip : took;
  return LinkCost{trip / 2, static_cast<double>(bytes) / wire, "probed"};
}

void respond(Communicator& comm, int peer) {
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

}  // namespace

void probeLinks(Communicator& comm, KeyValueStore& store, const std::string& key,
                const Topology& topology, LinkCosts* links) {
  if (!config().probeLinks || topology.hosts() < 2) return;
  const Grid grid = gridOf(topology);
  for (int d = 1; d < static_cast<int>(grid.dims.size()); ++d) {
    if (grid.dims[d] < 2 || links->at(d).origin != "default") continue;
    std::vector<std::vector<int>> rings = dimensionRings(topology, grid, d);
    if (rings.empty()) continue;
    const int measurer = rings[0][0], responder = rings[0][1];
    const std::string result = key + "links/" + std::to_string(d);
    if (comm.rank() == measurer) {
      LinkCost cost = measure(comm, responder);
      char text[64];
      std::snprintf(text, sizeof(text), "%.9g %.9g", cost.latency, cost.bandwidth);
      store.set(result, text);
    } else if (comm.rank() == responder) {
      respond(comm, measurer);
    }
    LinkCost cost{0, 0, "probed"};
    if (std::sscanf(store.get(result).c_str(), "%lf %lf", &cost.latency, &cost.bandwidth) != 2 ||
        !(cost.bandwidth > 0)) {
      throw Error("ddl: the link probe of dimension " + std::to_string(d) + " published nothing");
    }
    if (static_cast<int>(links->byDimension.size()) <= d) {
      links->byDimension.resize(d + 1, links->byDimension.back());
    }
    links->byDimension[d] = cost;
  }
}

}  // namespace ddl
