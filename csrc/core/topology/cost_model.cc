#include "cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "../base/types.h"

namespace ddl {
namespace {

// A link: its dimension, the block it leaves or enters, the direction (out of the block).
using LinkKey = std::tuple<int, int, bool>;

// Dimension k's links, numbered from 0: two a block (out, then in), dimension 0's a rank.
size_t linksOf(const Topology& t, size_t k) {
  return 2 * static_cast<size_t>(k == 0 ? t.size : t.levels[k - 1].blocks());
}
size_t linkNumber(int block, bool out) { return 2 * static_cast<size_t>(block) + (out ? 0 : 1); }

// Bytes through each link. Every question of it is a sum or a most over the links, which no
// order changes. Dimension k's links are held by block (dimension 0's by rank), out of and into
// it, in an array made when a message first crosses the dimension; the links touched are listed,
// so that a load over one level costs that level's links only. (A hash map of the links, hashed
// and allocated at every edge of every ring, was most of a plan's pricing at thousands of ranks.)
class Loads {
 public:
  explicit Loads(const Topology& t) : t_(t), dimensions_(t.levels.size() + 1) {}
  // Returns the message's dimension.
  int transfer(int from, int to, double bytes) {
    const int k = dimensionBetween(t_, from, to);
    crossed_ |= 1u << std::min(k, 31);
    if (k == 0) {
      at(0, from, true) += bytes;
      at(0, to, false) += bytes;
      return k;
    }
    for (int j = 1; j <= k; ++j) {
      at(j, t_.levels[j - 1].blockOf(from), true) += bytes;
      at(j, t_.levels[j - 1].blockOf(to), false) += bytes;
    }
    return k;
  }
  void add(const Loads& other, double factor) {
    other.each([&](int k, int block, bool out, double b) { at(k, block, out) += b * factor; });
    crossed_ |= other.crossed_;
  }
  double seconds(const LinkCosts& links) const {
    double worst = 0;
    each([&](int k, int, bool, double b) { worst = std::max(worst, b / links.at(k).bandwidth); });
    return worst;
  }
  // A step waits for its slowest message: the largest latency of the dimensions it crosses (not
  // always the outermost: a busy host's ranks may answer more slowly than the network).
  double latency(const LinkCosts& links) const { return worst(links, &LinkCost::latency); }
  // What a message costs each side's processor: the largest overhead of the dimensions crossed.
  double overhead(const LinkCosts& links) const { return worst(links, &LinkCost::overhead); }
  // A message of `bytes` over the slowest link this load uses (a ring's edges cross the same
  // dimensions).
  double messageSeconds(const LinkCosts& links, double bytes) const {
    double slowest = 0;
    each([&](int k, int, bool, double b) {
      if (b > 0) slowest = std::max(slowest, bytes / links.at(k).bandwidth);
    });
    return slowest;
  }
  // Adds to `busy` each link's time in this load: its bytes over its bandwidth.
  using Busy = std::map<LinkKey, double>;  // in order: the bottleneck's ties break by it
  void occupy(const LinkCosts& links, Busy& busy) const {
    each([&](int k, int block, bool out, double b) {
      busy[{k, block, out}] += b / links.at(k).bandwidth;
    });
  }

 private:
  struct Dimension {
    std::vector<double> bytes;    // by block, out then in; < 0: untouched
    std::vector<size_t> touched;  // indices into bytes, in the order first touched
  };
  double& at(int k, int block, bool out) {
    Dimension& d = dimensions_[static_cast<size_t>(k)];
    if (d.bytes.empty()) d.bytes.assign(linksOf(t_, static_cast<size_t>(k)), -1.0);
    const size_t index = linkNumber(block, out);
    double& b = d.bytes[index];
    if (b < 0) {
      b = 0;
      d.touched.push_back(index);
    }
    return b;
  }
  // The largest figure of the dimensions a message crosses.
  double worst(const LinkCosts& links, double LinkCost::*figure) const {
    double most = 0;
    for (int k = 0; k < 32; ++k) {
      if (crossed_ >> k & 1u) most = std::max(most, links.at(k).*figure);
    }
    return most;
  }
  template <typename F>
  void each(F f) const {
    for (size_t k = 0; k < dimensions_.size(); ++k) {
      const Dimension& d = dimensions_[k];
      for (size_t index : d.touched) {
        f(static_cast<int>(k), static_cast<int>(index / 2), index % 2 == 0, d.bytes[index]);
      }
    }
  }

  const Topology& t_;
  uint32_t crossed_ = 0;  // bit k: a message crosses dimension k
  std::vector<Dimension> dimensions_;
};

// A flat ring in `order` carrying `bytes` (2(P-1) steps of bytes/P).
void ringLoads(Loads& loads, const std::vector<int>& order, double bytes) {
  const size_t n = order.size();
  for (size_t p = 0; p < n; ++p) {
    loads.transfer(order[p], order[(p + 1) % n], 2.0 * bytes * (n - 1) / n);
  }
}

double reduceSeconds(const LinkCosts& links, double bytes) {
  return links.reduceBandwidth > 0 ? bytes / links.reduceBandwidth : 0;
}

double predictRing(const Topology& t, const LinkCosts& links, double bytes, int rings) {
  // A step's message travels in segments, each passed on as soon as it has arrived (and been
  // reduced): a segment's trip round the ring costs what the ring's edges cost it, and the
  // others follow it as fast as the busiest link lets them, or as a rank's processor passes
  // every ring's segments on.
  Loads total(t);
  double path = 0;  // one lap of one segment: each edge's latency, transfer and overheads
  const double message = bytes / rings / t.size;
  const double segment = std::min(message, links.segmentBytes);
  const double segments = segment > 0 ? std::ceil(message / segment) : 1;
  double slowest = 0, processor = 0;  // a rank's overheads a step: its in-edge's and out-edge's
  for (int r = 0; r < rings; ++r) {
    RingPlan ring = naturalRing(t.size, r % 2 == 1);
    ringLoads(total, ring.order, bytes / rings);
    if (r > 0) continue;
    std::vector<double> overheads(t.size);  // by edge: from position p to p + 1
    for (int p = 0; p < t.size; ++p) {
      Loads edge(t);
      edge.transfer(ring.order[p], ring.order[(p + 1) % t.size], segment);
      overheads[p] = edge.overhead(links);
      path += edge.latency(links) + edge.messageSeconds(links, segment) + 2 * overheads[p];
      slowest = std::max(slowest, edge.latency(links));
    }
    for (int p = 0; p < t.size; ++p) {
      processor = std::max(processor, overheads[p] + overheads[(p + t.size - 1) % t.size]);
    }
  }
  const double steps = 2.0 * (t.size - 1);
  const double reduce = reduceSeconds(links, segment);
  // Where a rank's overheads outlast a lap's share of a step, its processor sets the pace, after
  // one lap to fill the ring.
  return std::max({path * steps / t.size + (t.size - 1) * reduce,
                   total.seconds(links) + slowest + reduce,
                   steps * rings * segments * processor + path});
}

// Recursive doubling among `ranks` (the fold pairs the first 2E, as the algorithm does).
double predictRecursiveDoubling(const Topology& t, const LinkCosts& links, double bytes,
                                const std::vector<int>& ranks) {
  const int n = static_cast<int>(ranks.size());
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  double seconds = 0;
  if (extra > 0) {
    Loads fold(t);
    for (int i = 0; i < extra; ++i) fold.transfer(ranks[2 * i], ranks[2 * i + 1], bytes);
    seconds += 2 * (fold.seconds(links) + fold.latency(links) + 2 * fold.overhead(links)) +
               reduceSeconds(links, bytes);
  }
  std::vector<int> virtualRanks;
  for (int v = 0; v < p2; ++v)
    virtualRanks.push_back(v < extra ? ranks[2 * v + 1] : ranks[v + extra]);
  for (int d = 1; d < p2; d *= 2) {
    Loads round(t);
    for (int v = 0; v < p2; ++v) round.transfer(virtualRanks[v], virtualRanks[v ^ d], bytes);
    seconds += round.seconds(links) + round.latency(links) + 2 * round.overhead(links) +
               reduceSeconds(links, bytes);
  }
  return seconds;
}

double predictLeaders(const Topology& t, const LinkCosts& links, double bytes,
                      const std::vector<std::vector<int>>& hosts) {
  Loads gather(t);
  std::vector<int> leaders;
  double reduce = 0, overheads = 0;  // a leader's: a message from each rank of its host
  for (const std::vector<int>& h : hosts) {
    reduce = std::max(reduce, (h.size() - 1) * reduceSeconds(links, bytes));
    overheads = std::max(overheads, static_cast<double>(h.size()) * links.at(0).overhead);
    leaders.push_back(h.front());
    for (size_t i = 1; i < h.size(); ++i) gather.transfer(h[i], h.front(), bytes);
  }
  double local = gather.seconds(links) + gather.latency(links) + overheads;
  return 2 * local + reduce + predictRecursiveDoubling(t, links, bytes, leaders);
}

// A multidim plan's pass (allreduce_plan.h): lanes advance in step, the i-th stage of every
// lane at once, so lanes of one order share that dimension's links, while colours (rotated
// orders) load different ones. One wave's pass is 2S tasks (the reduce-scatter stages, then the
// allgather's in reverse); each holds the links it loads for their bytes' time and the ranks for
// their reductions.
struct PassTask {
  double seconds = 0;
  Loads::Busy holds;
};

// One stage's first waves, as priceStages gathers them.
struct StageFigures {
  size_t longest = 0;
  double message = 0;       // the largest a first-wave ring sends in one step
  double reduce = 0;        // a rank's reductions and overheads in the reduce-scatter
  double sends = 0;         // a rank's overheads in the allgather
  int lanes = 0;            // first-wave lanes in this stage
  double ringLatency = 0;   // the most a first-wave ring's step waits, on average over its edges
  double stepOverhead = 0;  // the most a first-wave ring's step costs a rank's processor
};

// A step: its latency, then its message, reduced segment by segment as they arrive; or, where
// the rings of the stage share a link or a rank's processor, their turns on those: the segments
// of every lane through the rank pass the link, then the reduction and overheads, one after
// another (a flow shop: the busier of the two, plus the other's share of one segment).
void priceStage(const StageFigures& f, const Loads& first, const LinkCosts& links,
                PassTask& scatter, PassTask& gather) {
  const std::tuple<int, int, bool> rank{-1, 0, true};  // the ranks, as a resource
  const double steps = static_cast<double>(f.longest - 1);
  const double latency = f.ringLatency > 0 ? f.ringLatency : first.latency(links);
  const double send = first.messageSeconds(links, f.message);
  const double part = f.message > 0 ? std::min(1.0, links.segmentBytes / f.message) : 1;
  // Segments of a step's message follow each other through the stage's steps.
  auto own = [&](double processor) {
    return latency + part * (send + processor) + (1 - part) * std::max(send, processor);
  };
  const double link = steps > 0 ? first.seconds(links) / steps : 0;
  const double units = std::max(1, f.lanes) / part;  // a rank's segments in one step
  auto shared = [&](double processor) {
    const double ranks = steps > 0 ? processor / steps : 0;
    return std::max(link, ranks) + std::min(link, ranks) / units;
  };
  const double reduce = reduceSeconds(links, f.message) + f.stepOverhead;
  gather.seconds = std::max(steps * own(f.stepOverhead), steps * shared(f.sends) + latency);
  scatter.seconds = std::max(steps * own(reduce), steps * shared(f.reduce) + latency);
  // While one ring waits out its latency the others use the link: a stage holds each link
  // for its bytes' time.
  first.occupy(links, gather.holds);
  scatter.holds = gather.holds;
  scatter.holds[rank] = f.reduce;
  if (f.sends > 0) gather.holds[rank] = f.sends;
}

// Prices each stage's reduce-scatter and allgather tasks (of the first waves), adds every lane's
// bytes to *total (no schedule beats its busiest link) and every lane's reductions and overheads
// on one rank to *allReduce.
void priceStages(const AllreducePlan& plan, const Topology& t, const LinkCosts& links,
                 std::vector<PassTask>& scatter, std::vector<PassTask>& gather, Loads* total,
                 double* allReduce) {
  for (size_t i = 0; i < scatter.size(); ++i) {
    Loads first(t);  // the first waves' bytes in stage i
    StageFigures f;
    for (const Lane& lane : plan.lanes) {
      if (i >= lane.stages.size()) continue;
      Loads loads(t);
      double laneReduce = 0, laneSends = 0;
      for (const StageRing& ring : lane.stages[i].rings) {
        const size_t n = ring.order.size();
        double piece = 0, chunk = 0;
        for (const Range& c : ring.chunks) {
          piece += static_cast<double>(c.length);
          chunk = std::max(chunk, static_cast<double>(c.length));
        }
        piece *= static_cast<double>(plan.elementSize);
        chunk *= static_cast<double>(plan.elementSize);
        // A step of rank p waits for p - 1's message of the step before: over the ring's steps
        // the wait goes once round every edge, each at its own dimension's latency (a ring over
        // hosts of several racks crosses a rack at a few of its edges only).
        double waits = 0, overhead = 0;
        for (size_t p = 0; p < n; ++p) {
          const int k = loads.transfer(ring.order[p], ring.order[(p + 1) % n], piece * (n - 1) / n);
          waits += links.at(k).latency;
          overhead = std::max(overhead, links.at(k).overhead);
        }
        // A step sends and receives its message in segments, each costing both processors.
        const double segments = chunk > 0 ? std::ceil(chunk / links.segmentBytes) : 1;
        const double perStep = 2 * overhead * segments;
        laneReduce = std::max(laneReduce, (n - 1) * (reduceSeconds(links, chunk) + perStep));
        laneSends = std::max(laneSends, (n - 1) * perStep);
        if (lane.after < 0) {
          f.longest = std::max(f.longest, n);
          f.message = std::max(f.message, chunk);
          if (n > 1) {
            f.ringLatency = std::max(f.ringLatency, waits / static_cast<double>(n));
            f.stepOverhead = std::max(f.stepOverhead, perStep);
          }
        }
      }
      total->add(loads, 2);
      *allReduce += laneReduce + laneSends;
      if (lane.after < 0) {
        ++f.lanes;
        first.add(loads, 1);
        f.reduce += laneReduce;
        f.sends += laneSends;
      }
    }
    priceStage(f, first, links, scatter[i], gather[i]);
  }
}

// Waves through the pass, a wave's task after its previous one and after the previous wave's
// same task (as the engine orders them), each started, earliest ready first, once the links
// and ranks it holds are free: when the last ends. Each task's holds are listed once, in their
// order as keys (its bottleneck's ties break by it), each link numbered from its dimension and
// block (the ranks, as a resource, 0): a task's turn then walks an array, where looking each up
// in a map of thousands of links, for every wave, was most of a plan's pricing at thousands of
// ranks.
double wavesMakespan(const Topology& t, const std::vector<const PassTask*>& pass, int planWaves) {
  std::vector<size_t> first = {1};  // by dimension: the number of its first link
  for (size_t k = 0; k <= t.levels.size(); ++k) first.push_back(first.back() + linksOf(t, k));
  std::vector<std::vector<std::pair<size_t, double>>> holds(pass.size());
  for (size_t i = 0; i < pass.size(); ++i) {
    for (const auto& [key, seconds] : pass[i]->holds) {
      const auto [k, block, out] = key;
      const size_t number = k < 0 ? 0 : first[static_cast<size_t>(k)] + linkNumber(block, out);
      holds[i].emplace_back(number, seconds);
    }
  }
  const size_t count = first.back();
  const size_t waves = static_cast<size_t>(std::max(planWaves, 1));
  std::vector<std::vector<double>> ends(waves, std::vector<double>(pass.size(), 0));
  std::vector<size_t> next(waves, 0);
  std::vector<double> freeAt(count, 0);
  double makespan = 0;
  for (size_t left = waves * pass.size(); left > 0; --left) {
    size_t pick = waves;
    double pickReady = 0;
    for (size_t w = 0; w < waves; ++w) {
      const size_t k = next[w];
      if (k == pass.size() || (w > 0 && next[w - 1] <= k)) continue;
      const double ready = std::max(k > 0 ? ends[w][k - 1] : 0.0, w > 0 ? ends[w - 1][k] : 0.0);
      if (pick == waves || ready < pickReady) {
        pick = w;
        pickReady = ready;
      }
    }
    const size_t task = next[pick];
    // It starts once the link it holds longest is free; on its other links its bytes queue
    // behind what is there, and it ends no sooner than they have passed.
    const std::pair<size_t, double>* bottleneck = nullptr;
    for (const auto& held : holds[task]) {
      if (bottleneck == nullptr || held.second > bottleneck->second) bottleneck = &held;
    }
    const double start =
        bottleneck != nullptr ? std::max(pickReady, freeAt[bottleneck->first]) : pickReady;
    double end = start + pass[task]->seconds;
    for (const auto& [number, seconds] : holds[task]) {
      if (seconds <= 0) continue;
      freeAt[number] = std::max(freeAt[number], start) + seconds;
      end = std::max(end, freeAt[number]);
    }
    ends[pick][task] = end;
    makespan = std::max(makespan, end);
    ++next[pick];
  }
  return makespan;
}

}  // namespace

double predictSeconds(const AllreducePlan& plan, const Topology& t, const LinkCosts& links) {
  const double bytes = static_cast<double>(plan.count) * plan.elementSize;
  switch (plan.algorithm) {
    case AllreduceAlgorithm::kAuto:  // (a request, never a plan's)
    case AllreduceAlgorithm::kTrivial:
      return 0;
    case AllreduceAlgorithm::kRecursiveDoubling:
      return predictRecursiveDoubling(t, links, bytes, naturalRing(t.size, false).order);
    case AllreduceAlgorithm::kLeaders:
      return predictLeaders(t, links, bytes, plan.hosts);
    case AllreduceAlgorithm::kRing:
    case AllreduceAlgorithm::kShared:
    case AllreduceAlgorithm::kSharedRing:
    case AllreduceAlgorithm::kDirect:
    case AllreduceAlgorithm::kStaged:
      return predictRing(t, links, bytes, plan.rings);
    case AllreduceAlgorithm::kMultiDim:
      break;
  }
  size_t stages = 0;
  for (const Lane& lane : plan.lanes) stages = std::max(stages, lane.stages.size());
  std::vector<PassTask> scatter(stages), gather(stages);
  double allReduce = 0;  // every lane's reductions on one rank
  Loads total(t);        // every lane's bytes: no schedule beats its busiest link
  priceStages(plan, t, links, scatter, gather, &total, &allReduce);
  std::vector<const PassTask*> pass;
  for (const PassTask& task : scatter) pass.push_back(&task);
  for (size_t i = stages; i-- > 0;) pass.push_back(&gather[i]);
  const double makespan = wavesMakespan(t, pass, plan.waves);
  return std::max({makespan, total.seconds(links), allReduce});
}

double estimateSeconds(CollectiveShape shape, const Topology& topology, const LinkCosts& links,
                       double bytes) {
  const int p = topology.size;
  if (p <= 1) return 0;
  const LinkCost& slowest =
      links.at(topology.hosts() > 1 ? static_cast<int>(topology.levels.size()) : 0);
  const double alpha = slowest.latency + 2 * slowest.overhead, beta = slowest.bandwidth;
  const double steps = std::ceil(std::log2(static_cast<double>(p)));
  switch (shape) {
    case CollectiveShape::kBarrier:
      return steps * alpha;
    case CollectiveShape::kTree:
      return steps * alpha + bytes / beta;
    case CollectiveShape::kPointToPoint:
      return alpha + bytes / beta;
    case CollectiveShape::kReduceScatter:  // `bytes`: this rank's share
      return (p - 1) * (alpha + bytes / beta);
    case CollectiveShape::kExchange:  // gathers, scatters, all-to-all: (P - 1) shares of the whole
      return (p - 1) * (alpha + bytes / p / beta);
  }
  return 0;
}

}  // namespace ddl
