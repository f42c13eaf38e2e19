// The allgather schedules' prices (cost_model.h): Bruck's rounds, the flat ring, the grid's rings
// and Bruck's rounds level by level; and Bruck's all_to_all.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cost_model.h"

namespace ddl {

const char* allgatherScheduleName(AllgatherSchedule schedule) {
  switch (schedule) {
    case AllgatherSchedule::kRing:
      return "ring";
    case AllgatherSchedule::kGrid:
      return "grid";
    case AllgatherSchedule::kBruck:
      return "bruck";
    case AllgatherSchedule::kGridBruck:
      return "grid_bruck";
  }
  return "?";
}

namespace {

// A round in which rank r sends to rank to(r): its slowest exchange. A message across dimension k
// loads the links of dimensions 1..k of the blocks it leaves, each shared by every rank of that
// block whose message leaves it in the round (a host's ranks its link, a rack's its uplink).
template <typename To>
AllgatherCosts::Round roundOf(const Topology& topology, const LinkCosts& links, To to) {
  const int p = topology.size;
  const size_t levels = topology.levels.size();
  std::vector<int> dimension(p);
  std::vector<std::vector<int>> leaving(levels);  // by level, by block: ranks leaving it
  for (size_t level = 0; level < levels; ++level) {
    leaving[level].assign(topology.levels[level].blocks(), 0);
  }
  for (int r = 0; r < p; ++r) {
    dimension[r] = dimensionBetween(topology, r, to(r));
    for (int k = 1; k <= dimension[r]; ++k) {
      ++leaving[k - 1][topology.levels[k - 1].blockOf(r)];
    }
  }
  AllgatherCosts::Round round;
  for (int r = 0; r < p; ++r) {
    round.latency = std::max(round.latency,
                             links.at(dimension[r]).latency + 2 * links.at(dimension[r]).overhead);
    double perByte = 1 / links.at(0).bandwidth;
    for (int k = 1; k <= dimension[r]; ++k) {
      const double sharers = leaving[k - 1][topology.levels[k - 1].blockOf(r)];
      perByte = std::max(perByte, sharers / links.at(k).bandwidth);
    }
    round.secondsPerByte = std::max(round.secondsPerByte, perByte);
  }
  return round;
}

}  // namespace

AllgatherCosts allgatherCosts(const Topology& topology, const LinkCosts& links) {
  AllgatherCosts costs;
  const int p = topology.size;
  costs.size = p;
  if (p <= 1) return costs;
  for (int d = 1; d < p; d *= 2) {
    costs.bruck.push_back(roundOf(topology, links, [d, p](int r) { return (r - d + p) % p; }));
  }
  costs.ringStep = roundOf(topology, links, [p](int r) { return (r + 1) % p; });
  // The grid: per dimension, outermost first, its extent's steps carrying the blocks gathered by
  // the dimensions outside it; every rank of a host in a ring of each dimension at once.
  // Every rank of a block of dimension k - 1 (a host, a rack) is in a ring of dimension k at
  // once, so they share the block's link.
  const Grid grid = gridOf(topology);
  int outside = 1;
  for (size_t k = grid.dims.size(); k-- > 0;) {
    const LinkCost& link = links.at(static_cast<int>(k));
    double sharers = 1;
    for (size_t j = 0; j < k; ++j) sharers *= grid.dims[j];
    costs.grid.push_back({link.latency + 2 * link.overhead, outside * sharers / link.bandwidth});
    costs.gridSteps.push_back(grid.dims[k] - 1);
    costs.gridBlocks.push_back(outside);
    outside *= grid.dims[k];
  }
  costs.copySecondsPerByte = 1 / links.at(0).bandwidth;
  return costs;
}

double alltoallBruckSeconds(const AllgatherCosts& costs, double bytes) {
  double seconds = 0;
  const int n = costs.size;
  int d = 1;
  for (const AllgatherCosts::Round& round : costs.bruck) {
    const int count = n / (2 * d) * d + std::max(0, n % (2 * d) - d);  // i < n with bit d
    seconds += round.latency + count * bytes * (round.secondsPerByte + costs.copySecondsPerByte);
    d *= 2;
  }
  return seconds;
}

double allgatherSeconds(AllgatherSchedule schedule, const AllgatherCosts& costs, double bytes,
                        bool reduceScatter) {
  if (costs.size <= 1) return 0;
  double seconds = 0;
  switch (schedule) {
    case AllgatherSchedule::kRing:
      return (costs.size - 1) * (costs.ringStep.latency + bytes * costs.ringStep.secondsPerByte);
    case AllgatherSchedule::kGrid:
      for (size_t k = 0; k < costs.grid.size(); ++k) {
        seconds +=
            costs.gridSteps[k] * (costs.grid[k].latency + bytes * costs.grid[k].secondsPerByte);
      }
      return seconds;
    case AllgatherSchedule::kBruck: {
      int held = 1;
      for (const AllgatherCosts::Round& round : costs.bruck) {
        const int count = std::min(held, costs.size - held);
        seconds += round.latency + count * bytes * round.secondsPerByte;
        held += count;
      }
      return seconds;
    }
    case AllgatherSchedule::kGridBruck:  // the grid's bytes, Bruck's rounds per dimension;
                                         // every position's blocks copied once, each round's
                                         // while the next round's move (allgather_bruck.cc)
      for (size_t k = 0; k < costs.grid.size(); ++k) {
        const int extent = costs.gridSteps[k] + 1;
        const double copy = costs.gridBlocks[k] * bytes * costs.copySecondsPerByte;
        if (reduceScatter) {  // the rounds backwards: each round's blocks summed (the first's
                              // packed) before its messages, the positions the last round
                              // brought that this rank keeps reduced while they move
          std::vector<int> counts;
          for (int held = 1; held < extent; held += counts.back()) {
            counts.push_back(std::min(held, extent - held));
          }
          int arrived = 0;
          for (size_t i = counts.size(); i-- > 0;) {
            const int keeping = std::min(1 << i, arrived);
            seconds += counts[i] * copy + costs.grid[k].latency +
                       std::max(counts[i] * bytes * costs.grid[k].secondsPerByte, keeping * copy);
            arrived = counts[i];
          }
          seconds += arrived * copy;
          continue;
        }
        seconds += copy;  // this rank's own position, packed
        int copying = 0;  // positions the last round brought
        for (int held = 1; held < extent;) {
          const int count = std::min(held, extent - held);
          seconds += costs.grid[k].latency +
                     std::max(count * bytes * costs.grid[k].secondsPerByte, copying * copy);
          copying = count;
          held += count;
        }
        seconds += copying * copy;
      }
      return seconds;
  }
  return seconds;
}

}  // namespace ddl
