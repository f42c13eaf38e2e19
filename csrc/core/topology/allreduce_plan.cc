#include "allreduce_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <tuple>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {
namespace {

// A range of elements one rank holds a partial sum of, over `weight` ranks.
struct Held {
  size_t begin;
  size_t end;
  int64_t weight;
};
using Holdings = std::vector<std::vector<Held>>;  // by rank

Holdings initialHoldings(int size, Range range) {
  Holdings h(size);
  if (range.length > 0) {
    for (auto& v : h) v.push_back(Held{range.offset, range.offset + range.length, 1});
  }
  return h;
}

// The weight with which `holdings` covers [begin, end) (uniformly), or -1.
int64_t weightOver(const std::vector<Held>& holdings, size_t begin, size_t end) {
  for (const Held& h : holdings) {
    if (h.begin <= begin && end <= h.end) return h.weight;
  }
  return -1;
}

void removeRange(std::vector<Held>& holdings, size_t begin, size_t end) {
  std::vector<Held> out;
  for (const Held& h : holdings) {
    if (h.end <= begin || end <= h.begin) {
      out.push_back(h);
      continue;
    }
    if (h.begin < begin) out.push_back(Held{h.begin, begin, h.weight});
    if (end < h.end) out.push_back(Held{end, h.end, h.weight});
  }
  holdings = std::move(out);
}

void addRange(std::vector<Held>& holdings, Range r, int64_t weight) {
  if (r.length == 0) return;
  holdings.push_back(Held{r.offset, r.offset + r.length, weight});
  std::sort(holdings.begin(), holdings.end(),
            [](const Held& a, const Held& b) { return a.begin < b.begin; });
  std::vector<Held> merged;
  for (const Held& h : holdings) {
    if (!merged.empty() && merged.back().end == h.begin && merged.back().weight == h.weight) {
      merged.back().end = h.end;
    } else {
      merged.push_back(h);
    }
  }
  holdings = std::move(merged);
}

// Applies one ring's reduce-scatter to the holdings; throws when a member does not hold the
// piece.
void applyRing(Holdings& holdings, const StageRing& ring) {
  const size_t begin = ring.chunks.front().offset;
  const size_t end = ring.chunks.back().offset + ring.chunks.back().length;
  int64_t sum = 0;
  for (int rank : ring.order) {
    int64_t w = weightOver(holdings[rank], begin, end);
    if (w < 0) {
      throw Error("ddl: plan has rank " + std::to_string(rank) + " reduce elements [" +
                  std::to_string(begin) + ", " + std::to_string(end) + ") it does not hold");
    }
    sum += w;
    removeRange(holdings[rank], begin, end);
  }
  for (size_t p = 0; p < ring.order.size(); ++p)
    addRange(holdings[ring.order[p]], ring.chunks[p], sum);
}

// One stage: within each group of `rings` (ranks in ring order), every piece held by two or more
// members with the same weights becomes a ring. Updates `holdings` and the lane's step counter.
// The groups of a stage have no rank in common, so their rings number their steps from the
// same base (only the rings of one group, which share ranks, need ranges apart): a stage takes
// the steps of its busiest group, not of every ring of the job.
Stage runStage(Holdings& holdings, const std::vector<std::vector<int>>& rings, int dimension,
               bool reversed, uint32_t& nextStep) {
  Stage stage;
  stage.dimension = dimension;
  const uint32_t base = nextStep;
  uint32_t end = base;
  for (const std::vector<int>& members : rings) {
    nextStep = base;
    std::vector<size_t> cuts;
    for (int r : members) {
      for (const Held& h : holdings[r]) {
        cuts.push_back(h.begin);
        cuts.push_back(h.end);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    using Key = std::vector<std::pair<int, int64_t>>;
    std::vector<std::pair<Range, Key>> pieces;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      Key key;
      for (int r : members) {
        int64_t w = weightOver(holdings[r], cuts[i], cuts[i + 1]);
        if (w >= 0) key.emplace_back(r, w);
      }
      Range range{cuts[i], cuts[i + 1] - cuts[i]};
      if (!pieces.empty() && pieces.back().second == key &&
          pieces.back().first.offset + pieces.back().first.length == range.offset) {
        pieces.back().first.length += range.length;
      } else {
        pieces.emplace_back(range, std::move(key));
      }
    }
    for (auto& [piece, key] : pieces) {
      if (key.size() < 2 || piece.length == 0) continue;
      StageRing ring;
      for (auto& [r, w] : key) ring.order.push_back(r);
      if (reversed) std::reverse(ring.order.begin(), ring.order.end());
      ring.chunks = splitEven(piece.length, ring.order.size());
      for (Range& c : ring.chunks) c.offset += piece.offset;
      ring.firstStep = nextStep;
      nextStep += 2 * static_cast<uint32_t>(ring.order.size() - 1);
      applyRing(holdings, ring);
      stage.rings.push_back(std::move(ring));
    }
    end = std::max(end, nextStep);
  }
  nextStep = end;
  return stage;
}

std::vector<int> allRanks(int size) {
  std::vector<int> v(size);
  for (int r = 0; r < size; ++r) v[r] = r;
  return v;
}

// The dimension of a message from a to b: 0 on one host, else the lowest level whose block holds
// both, plus one (the number of levels when only the whole group does).
int edgeDimension(const Topology& t, int a, int b) {
  for (size_t k = 0; k < t.levels.size(); ++k) {
    if (t.levels[k].blockOf[a] == t.levels[k].blockOf[b]) return static_cast<int>(k);
  }
  return static_cast<int>(t.levels.size());
}

// Bytes through each link (dimension, block it leaves or enters, direction).
class Loads {
 public:
  explicit Loads(const Topology& t) : t_(t) {}
  void transfer(int from, int to, double bytes) {
    int k = edgeDimension(t_, from, to);
    dimensions_ |= 1u << std::min(k, 31);
    if (k == 0) {
      bytes_[{0, from, true}] += bytes;
      bytes_[{0, to, false}] += bytes;
      return;
    }
    for (int j = 1; j <= k; ++j) {
      bytes_[{j, t_.levels[j - 1].blockOf[from], true}] += bytes;
      bytes_[{j, t_.levels[j - 1].blockOf[to], false}] += bytes;
    }
  }
  void add(const Loads& other, double factor) {
    for (auto& [key, b] : other.bytes_) bytes_[key] += b * factor;
    dimensions_ |= other.dimensions_;
  }
  double seconds(const LinkCosts& links) const {
    double worst = 0;
    for (auto& [key, b] : bytes_) worst = std::max(worst, b / links.at(std::get<0>(key)).bandwidth);
    return worst;
  }
  // A step waits for its slowest message: the largest latency of the dimensions it crosses (not
  // always the outermost: a busy host's ranks may answer more slowly than the network).
  double latency(const LinkCosts& links) const {
    double worst = 0;
    for (int k = 0; k < 32; ++k) {
      if (dimensions_ >> k & 1u) worst = std::max(worst, links.at(k).latency);
    }
    return worst;
  }
  // A message of `bytes` over the slowest link this load uses (a ring's edges cross the same
  // dimensions).
  double messageSeconds(const LinkCosts& links, double bytes) const {
    double slowest = 0;
    for (auto& [key, b] : bytes_) {
      if (b > 0) slowest = std::max(slowest, bytes / links.at(std::get<0>(key)).bandwidth);
    }
    return slowest;
  }
  // Adds to `busy` each link's time in this load: its bytes over its bandwidth.
  using Busy = std::map<std::tuple<int, int, bool>, double>;
  void occupy(const LinkCosts& links, Busy& busy) const {
    for (auto& [key, b] : bytes_) busy[key] += b / links.at(std::get<0>(key)).bandwidth;
  }

 private:
  const Topology& t_;
  uint32_t dimensions_ = 0;  // bit k: a message crosses dimension k
  std::map<std::tuple<int, int, bool>, double> bytes_;
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
  // others follow it as fast as the busiest link lets them.
  Loads total(t);
  double path = 0;  // one lap of one segment: each edge's latency and transfer
  const double message = bytes / rings / t.size;
  const double segment = std::min(message, links.segmentBytes);
  double slowest = 0;
  for (int r = 0; r < rings; ++r) {
    RingPlan ring = naturalRing(t.size, r % 2 == 1);
    ringLoads(total, ring.order, bytes / rings);
    if (r > 0) continue;
    for (int p = 0; p < t.size; ++p) {
      Loads edge(t);
      edge.transfer(ring.order[p], ring.order[(p + 1) % t.size], segment);
      path += edge.latency(links) + edge.messageSeconds(links, segment);
      slowest = std::max(slowest, edge.latency(links));
    }
  }
  const double steps = 2.0 * (t.size - 1);
  const double reduce = reduceSeconds(links, segment);
  return std::max(path * steps / t.size + (t.size - 1) * reduce,
                  total.seconds(links) + slowest + reduce);
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
    seconds += 2 * (fold.seconds(links) + fold.latency(links)) + reduceSeconds(links, bytes);
  }
  std::vector<int> virtualRanks;
  for (int v = 0; v < p2; ++v)
    virtualRanks.push_back(v < extra ? ranks[2 * v + 1] : ranks[v + extra]);
  for (int d = 1; d < p2; d *= 2) {
    Loads round(t);
    for (int v = 0; v < p2; ++v) round.transfer(virtualRanks[v], virtualRanks[v ^ d], bytes);
    seconds += round.seconds(links) + round.latency(links) + reduceSeconds(links, bytes);
  }
  return seconds;
}

double predictLeaders(const Topology& t, const LinkCosts& links, double bytes,
                      const std::vector<std::vector<int>>& hosts) {
  Loads gather(t);
  std::vector<int> leaders;
  double reduce = 0;
  for (const std::vector<int>& h : hosts) {
    reduce = std::max(reduce, (h.size() - 1) * reduceSeconds(links, bytes));
    leaders.push_back(h.front());
    for (size_t i = 1; i < h.size(); ++i) gather.transfer(h[i], h.front(), bytes);
  }
  double local = gather.seconds(links) + gather.latency(links);
  return 2 * local + reduce + predictRecursiveDoubling(t, links, bytes, leaders);
}

double parseNumber(const std::string& text, const std::string& entry, size_t& used,
                   bool zeroAllowed) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  used = static_cast<size_t>(end - text.c_str());
  if (used == 0 || !(v > 0 || (zeroAllowed && v == 0)) || !std::isfinite(v)) {
    throw Error("ddl: TORCH_DDL_LINKS entry '" + entry +
                "' is not 'dimension:latency:bandwidth' (e.g. '1:50us:117MB')");
  }
  return v;
}

// "117MB", "1.2GB", "5e9": bytes per second.
double parseBandwidth(const std::string& bw, const std::string& entry) {
  size_t used = 0;
  double bandwidth = parseNumber(bw, entry, used, false);
  std::string unit = bw.substr(used);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == '/') unit.pop_back();
  if (unit == "K") {
    bandwidth *= 1e3;
  } else if (unit == "M") {
    bandwidth *= 1e6;
  } else if (unit == "G") {
    bandwidth *= 1e9;
  } else if (!unit.empty()) {
    throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "': bandwidth unit '" + unit +
                "' is not B, KB, MB or GB");
  }
  return bandwidth;
}

}  // namespace

const LinkCost& LinkCosts::at(int dimension) const {
  static const LinkCosts defaults = defaultLinks();
  if (dimension < static_cast<int>(byDimension.size())) return byDimension[dimension];
  if (!byDimension.empty()) return byDimension.back();
  return defaults.at(dimension);
}

std::string LinkCosts::describe() const {
  std::ostringstream out;
  for (size_t k = 0; k < byDimension.size(); ++k) {
    if (k > 0) out << ",";
    out << k << ":" << byDimension[k].latency * 1e6 << "us:" << byDimension[k].bandwidth / 1e6
        << "MB";
  }
  if (reduceBandwidth > 0) out << ",reduce:" << reduceBandwidth / 1e6 << "MB";
  std::string origins;
  for (size_t k = 0; k < byDimension.size(); ++k) {
    if (byDimension[k].origin == "default") continue;
    origins += (origins.empty() ? "" : ", ") + std::to_string(k) + " " + byDimension[k].origin;
  }
  if (!origins.empty()) out << " (" << origins << ")";
  return out.str();
}

LinkCosts defaultLinks() { return LinkCosts{{{2e-6, 5e9}, {30e-6, 1.25e9}, {50e-6, 1.25e9}}}; }

LinkCosts parseLinks(const std::string& spec) {
  LinkCosts links = defaultLinks();
  std::string all = spec;
  std::replace(all.begin(), all.end(), ';', ',');
  std::istringstream entries(all);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry.erase(std::remove_if(entry.begin(), entry.end(), ::isspace), entry.end());
    if (entry.empty()) continue;
    size_t a = entry.find(':');
    if (entry.substr(0, a) == "reduce" && a != std::string::npos) {
      links.reduceBandwidth = parseBandwidth(entry.substr(a + 1), entry);
      continue;
    }
    size_t b = a == std::string::npos ? a : entry.find(':', a + 1);
    if (b == std::string::npos) {
      throw Error("ddl: TORCH_DDL_LINKS entry '" + entry +
                  "' is not 'dimension:latency:bandwidth' (e.g. '1:50us:117MB')");
    }
    std::string dim = entry.substr(0, a);
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos || dim.size() > 2) {
      throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "' does not start with a dimension");
    }
    int k = std::stoi(dim);
    std::string lat = entry.substr(a + 1, b - a - 1);
    std::string bw = entry.substr(b + 1);
    size_t used = 0;
    double latency = parseNumber(lat, entry, used, true);
    std::string unit = lat.substr(used);
    if (unit == "s") {
    } else if (unit == "ms") {
      latency *= 1e-3;
    } else if (unit == "us" || unit.empty()) {
      latency *= 1e-6;
    } else if (unit == "ns") {
      latency *= 1e-9;
    } else {
      throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "': latency unit '" + unit +
                  "' is not s, ms, us or ns");
    }
    const double bandwidth = parseBandwidth(bw, entry);
    if (static_cast<int>(links.byDimension.size()) <= k) {
      links.byDimension.resize(k + 1, links.byDimension.back());
    }
    links.byDimension[k] = LinkCost{latency, bandwidth, "TORCH_DDL_LINKS"};
  }
  return links;
}

std::string AllreducePlan::describe() const {
  std::ostringstream out;
  out << allreduceAlgorithmName(algorithm);
  if (algorithm == AllreduceAlgorithm::kRing) out << " rings=" << rings;
  if (algorithm == AllreduceAlgorithm::kMultiDim) {
    out << " colors=" << colors << " rings=" << rings << " waves=" << waves;
    if (!hostSlots) out << " host=messages";
    if (!lanes.empty()) {
      out << " order=";
      for (size_t i = 0; i < lanes[0].order.size(); ++i) {
        out << (i ? "," : "") << lanes[0].order[i];
      }
    }
  }
  return out.str();
}

AllreducePlan planMultiDim(const Topology& t, size_t count, size_t elementSize, int colors,
                           int rings, const std::vector<int>& order, int waves) {
  colors = std::max(colors, 1);
  rings = std::max(rings, 1);
  waves = std::max(waves, 1);
  if (colors * rings * waves > static_cast<int>(tag::kPlanPhases)) {
    throw Error("ddl: " + std::to_string(colors) + " colours x " + std::to_string(rings) +
                " rings x " + std::to_string(waves) + " waves need more than the " +
                std::to_string(tag::kPlanPhases) + " tag phases a plan has");
  }
  const Grid grid = gridOf(t);
  std::vector<int> dims;
  for (int k : order) {
    if (k < 0 || k >= static_cast<int>(grid.dims.size())) {
      throw Error("ddl: level order names dimension " + std::to_string(k) + "; this topology has " +
                  std::to_string(grid.dims.size()) + " (0 within a host, 1 across hosts, ...)");
    }
    if (std::find(dims.begin(), dims.end(), k) != dims.end()) {
      throw Error("ddl: level order names dimension " + std::to_string(k) + " twice");
    }
    dims.push_back(k);
  }
  for (int k = 0; k < static_cast<int>(grid.dims.size()); ++k) {
    if (std::find(dims.begin(), dims.end(), k) == dims.end()) dims.push_back(k);
  }
  std::erase_if(dims, [&](int k) { return grid.dims[k] < 2; });
  std::vector<std::vector<std::vector<int>>> ringsOf(grid.dims.size());
  for (int k : dims) ringsOf[k] = dimensionRings(t, grid, k);

  AllreducePlan plan;
  plan.algorithm = AllreduceAlgorithm::kMultiDim;
  plan.count = count;
  plan.elementSize = elementSize;
  plan.colors = colors;
  plan.rings = rings;
  plan.waves = waves;
  std::vector<Range> shares = splitEven(count, static_cast<size_t>(colors * rings * waves));
  for (int c = 0; c < colors; ++c) {
    for (int r = 0; r < rings; ++r) {
      for (int w = 0; w < waves; ++w) {
        const int index = (c * rings + r) * waves + w;
        Lane lane;
        lane.range = shares[index];
        lane.phase = static_cast<uint32_t>(index);
        lane.after = w > 0 ? index - 1 : -1;
        lane.reversed = r % 2 == 1;
        lane.order = dims;
        if (!dims.empty()) {
          std::rotate(lane.order.begin(), lane.order.begin() + c % dims.size(), lane.order.end());
        }
        Holdings holdings = initialHoldings(t.size, lane.range);
        uint32_t nextStep = 0;
        for (int k : lane.order) {
          Stage stage = runStage(holdings, ringsOf[k], k, lane.reversed, nextStep);
          if (!stage.rings.empty()) lane.stages.push_back(std::move(stage));
        }
        Stage closing = runStage(holdings, {allRanks(t.size)}, -1, lane.reversed, nextStep);
        if (!closing.rings.empty()) lane.stages.push_back(std::move(closing));
        plan.lanes.push_back(std::move(lane));
      }
    }
  }
  return plan;
}

double predictSeconds(const AllreducePlan& plan, const Topology& t, const LinkCosts& links) {
  const double bytes = static_cast<double>(plan.count) * plan.elementSize;
  switch (plan.algorithm) {
    case AllreduceAlgorithm::kTrivial:
      return 0;
    case AllreduceAlgorithm::kRecursiveDoubling:
      return predictRecursiveDoubling(t, links, bytes, allRanks(t.size));
    case AllreduceAlgorithm::kLeaders:
      return predictLeaders(t, links, bytes, plan.hosts);
    case AllreduceAlgorithm::kRing:
    case AllreduceAlgorithm::kShared:
      return predictRing(t, links, bytes, plan.rings);
    case AllreduceAlgorithm::kMultiDim:
      break;
  }
  // Lanes advance in step: the i-th stage of every lane runs at once, so lanes of one order
  // share that dimension's links, while colours (rotated orders) load different ones. One
  // wave's pass is 2S tasks (the reduce-scatter stages, then the allgather's in reverse); each
  // holds the links it loads for their bytes' time and the ranks for their reductions.
  struct Task {
    double seconds = 0;
    Loads::Busy holds;
  };
  size_t stages = 0;
  for (const Lane& lane : plan.lanes) stages = std::max(stages, lane.stages.size());
  std::vector<Task> scatter(stages), gather(stages);
  double allReduce = 0;  // every lane's reductions on one rank
  Loads total(t);        // every lane's bytes: no schedule beats its busiest link
  const std::tuple<int, int, bool> rank{-1, 0, true};  // the ranks, as a resource
  for (size_t i = 0; i < stages; ++i) {
    Loads first(t);  // the first waves' bytes in stage i
    size_t longest = 0;
    double message = 0;      // the largest a first-wave ring sends in one step
    double firstReduce = 0;  // a rank's reductions in this stage, over the first waves
    int firstLanes = 0;      // first-wave lanes in this stage
    for (const Lane& lane : plan.lanes) {
      if (i >= lane.stages.size()) continue;
      Loads loads(t);
      double laneReduce = 0;
      for (const StageRing& ring : lane.stages[i].rings) {
        const size_t n = ring.order.size();
        double piece = 0, chunk = 0;
        for (const Range& c : ring.chunks) {
          piece += static_cast<double>(c.length);
          chunk = std::max(chunk, static_cast<double>(c.length));
        }
        piece *= static_cast<double>(plan.elementSize);
        chunk *= static_cast<double>(plan.elementSize);
        for (size_t p = 0; p < n; ++p) {
          loads.transfer(ring.order[p], ring.order[(p + 1) % n], piece * (n - 1) / n);
        }
        laneReduce = std::max(laneReduce, (n - 1) * reduceSeconds(links, chunk));
        if (lane.after < 0) {
          longest = std::max(longest, n);
          message = std::max(message, chunk);
        }
      }
      total.add(loads, 2);
      allReduce += laneReduce;
      if (lane.after < 0) {
        ++firstLanes;
        first.add(loads, 1);
        firstReduce += laneReduce;
      }
    }
    // A step: its latency, then its message, reduced segment by segment as they arrive; or, where
    // the rings of the stage share a link or a rank's reductions, their turns on those: the
    // segments of every lane through the rank pass the link, then the reduction, one after
    // another (a flow shop: the busier of the two, plus the other's share of one segment).
    const double steps = static_cast<double>(longest - 1);
    const double latency = first.latency(links);
    const double send = first.messageSeconds(links, message);
    const double part = message > 0 ? std::min(1.0, links.segmentBytes / message) : 1;
    const double reduce = reduceSeconds(links, message);
    // Segments of a step's message follow each other through the stage's steps.
    const double own = latency + part * (send + reduce) + (1 - part) * std::max(send, reduce);
    const double link = steps > 0 ? first.seconds(links) / steps : 0;
    const double ranks = steps > 0 ? firstReduce / steps : 0;
    const double units = std::max(1, firstLanes) / part;  // a rank's segments in one step
    const double shared = std::max(link, ranks) + std::min(link, ranks) / units;
    gather[i].seconds = std::max(steps * (latency + send), steps * link + latency);
    scatter[i].seconds = std::max(steps * own, steps * shared + latency);
    // While one ring waits out its latency the others use the link: a stage holds each link
    // for its bytes' time.
    first.occupy(links, gather[i].holds);
    scatter[i].holds = gather[i].holds;
    scatter[i].holds[rank] = firstReduce;
  }
  std::vector<const Task*> pass;
  for (const Task& task : scatter) pass.push_back(&task);
  for (size_t i = stages; i-- > 0;) pass.push_back(&gather[i]);
  // Waves through the pass, a wave's task after its previous one and after the previous wave's
  // same task (as the engine orders them), each started, earliest ready first, once the links
  // and ranks it holds are free.
  const size_t waves = static_cast<size_t>(std::max(plan.waves, 1));
  std::vector<std::vector<double>> ends(waves, std::vector<double>(pass.size(), 0));
  std::vector<size_t> next(waves, 0);
  Loads::Busy freeAt;
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
    const Task& task = *pass[next[pick]];
    // It starts once the link it holds longest is free; on its other links its bytes queue
    // behind what is there, and it ends no sooner than they have passed.
    const std::tuple<int, int, bool>* bottleneck = nullptr;
    for (auto& [key, seconds] : task.holds) {
      if (bottleneck == nullptr || seconds > task.holds.at(*bottleneck)) bottleneck = &key;
    }
    const double start =
        bottleneck != nullptr ? std::max(pickReady, freeAt[*bottleneck]) : pickReady;
    double end = start + task.seconds;
    for (auto& [key, seconds] : task.holds) {
      if (seconds <= 0) continue;
      freeAt[key] = std::max(freeAt[key], start) + seconds;
      end = std::max(end, freeAt[key]);
    }
    ends[pick][next[pick]] = end;
    makespan = std::max(makespan, end);
    ++next[pick];
  }
  return std::max({makespan, total.seconds(links), allReduce});
}

namespace {

AllreducePlan simplePlan(AllreduceAlgorithm algorithm, size_t count, size_t elementSize,
                         int rings = 1) {
  AllreducePlan plan;
  plan.algorithm = algorithm;
  plan.count = count;
  plan.elementSize = elementSize;
  plan.rings = rings;
  return plan;
}

AllreducePlan leadersPlan(const Topology& t, size_t count, size_t elementSize) {
  AllreducePlan plan = simplePlan(AllreduceAlgorithm::kLeaders, count, elementSize);
  plan.hosts = t.members(0);
  return plan;
}

}  // namespace

std::vector<AllreducePlan> allreduceCandidates(const Topology& t, const LinkCosts& links,
                                               size_t count, size_t elementSize,
                                               const PlanRequest& request) {
  using A = AllreduceAlgorithm;
  std::vector<AllreducePlan> out;
  if (t.size == 1 || count == 0) {
    out.push_back(simplePlan(AllreduceAlgorithm::kTrivial, count, elementSize));
    return out;
  }
  const size_t bytes = count * elementSize;
  const Grid grid = gridOf(t);
  int dims = 0;
  for (int d : grid.dims) dims += d > 1 ? 1 : 0;
  auto multiDim = [&](int colors, int rings, int waves) {
    out.push_back(planMultiDim(t, count, elementSize, colors, rings, request.order, waves));
    out.back().hostSlots = request.hostSlots;
  };
  auto multiDimChoices = [&] {
    std::vector<int> colorChoices, ringChoices;
    for (int c = 1; c <= std::max(dims, 1); ++c) {
      if (request.colors == 0 || request.colors == c) colorChoices.push_back(c);
    }
    if (colorChoices.empty()) colorChoices.push_back(request.colors);
    for (int r = 1; r <= 2; ++r) {
      if (request.rings == 0 || request.rings == r) ringChoices.push_back(r);
    }
    if (ringChoices.empty()) ringChoices.push_back(request.rings);
    std::vector<int> waveChoices = {1, 2, 4, 8};
    if (request.waves > 0) waveChoices = {request.waves};
    for (int c : colorChoices) {
      for (int r : ringChoices) {
        for (int w : waveChoices) {
          if (c * r * w <= static_cast<int>(tag::kPlanPhases)) multiDim(c, r, w);
        }
      }
    }
  };
  switch (request.algorithm) {
    case A::kRecursiveDoubling:
      out.push_back(simplePlan(AllreduceAlgorithm::kRecursiveDoubling, count, elementSize));
      break;
    case A::kLeaders:
      out.push_back(leadersPlan(t, count, elementSize));
      break;
    case A::kRing:
      out.push_back(simplePlan(AllreduceAlgorithm::kRing, count, elementSize, request.ringRings));
      break;
    case A::kShared:
    case A::kSharedRing:
    case A::kDirect:
      out.push_back(simplePlan(AllreduceAlgorithm::kShared, count, elementSize));
      break;
    case A::kMultiDim:
      multiDimChoices();
      break;
    case A::kAuto:
    case A::kTrivial:  // (not a request: the planner's choice)
      if (t.hosts() == 1) {
        out.push_back(simplePlan(bytes <= request.smallBytes
                                     ? AllreduceAlgorithm::kRecursiveDoubling
                                     : AllreduceAlgorithm::kShared,
                                 count, elementSize));
        break;
      }
      out.push_back(simplePlan(AllreduceAlgorithm::kRecursiveDoubling, count, elementSize));
      out.push_back(leadersPlan(t, count, elementSize));
      out.push_back(simplePlan(AllreduceAlgorithm::kRing, count, elementSize, request.ringRings));
      if (static_cast<size_t>(dims) > 0) multiDimChoices();
      break;
  }
  for (AllreducePlan& plan : out) plan.predicted = predictSeconds(plan, t, links);
  // The cheapest first; among equals the earlier (simpler) one.
  std::stable_sort(out.begin(), out.end(), [](const AllreducePlan& a, const AllreducePlan& b) {
    return a.predicted < b.predicted * 0.999;
  });
  return out;
}

AllreducePlan planAllreduce(const Topology& t, const LinkCosts& links, size_t count,
                            size_t elementSize, const PlanRequest& request) {
  std::vector<AllreducePlan> candidates =
      allreduceCandidates(t, links, count, elementSize, request);
  AllreducePlan plan = std::move(candidates.front());
  if (plan.algorithm == AllreduceAlgorithm::kMultiDim) checkPlan(plan, t.size);
  return plan;
}

void checkPlan(const AllreducePlan& plan, int size) {
  if (plan.algorithm != AllreduceAlgorithm::kMultiDim) return;
  size_t covered = 0;
  std::vector<bool> phaseUsed(tag::kPlanPhases, false);
  for (const Lane& lane : plan.lanes) {
    if (lane.range.offset != covered) throw Error("ddl: plan lanes do not tile the buffer");
    covered += lane.range.length;
    if (lane.phase >= tag::kPlanPhases || phaseUsed[lane.phase]) {
      throw Error("ddl: plan lane phase " + std::to_string(lane.phase) + " is reused or too large");
    }
    phaseUsed[lane.phase] = true;
    const int index = static_cast<int>(&lane - plan.lanes.data());
    if (lane.after >= index) {
      throw Error("ddl: plan lane " + std::to_string(index) + " follows lane " +
                  std::to_string(lane.after) + ", which is not an earlier wave of it");
    }
    Holdings holdings = initialHoldings(size, lane.range);
    // By rank: the step ranges of the rings it is in (rings that share a rank share no step).
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> steps(size);
    for (const Stage& stage : lane.stages) {
      for (const StageRing& ring : stage.rings) {
        const size_t n = ring.order.size();
        if (n < 2 || ring.chunks.size() != n) {
          throw Error("ddl: plan ring of " + std::to_string(n) + " ranks has " +
                      std::to_string(ring.chunks.size()) + " chunks");
        }
        checkRing(RingPlan{ring.order}, size, false);
        for (size_t p = 1; p < n; ++p) {
          if (ring.chunks[p].offset != ring.chunks[p - 1].offset + ring.chunks[p - 1].length) {
            throw Error("ddl: plan ring chunks are not contiguous");
          }
        }
        uint64_t last = uint64_t{ring.firstStep} + 2 * (n - 1);
        if (last > tag::kMaxSteps) {
          throw Error("ddl: plan needs " + std::to_string(last) + " tag steps in one lane; " +
                      std::to_string(tag::kMaxSteps) + " fit");
        }
        for (int r : ring.order) steps[r].emplace_back(ring.firstStep, static_cast<uint32_t>(last));
        applyRing(holdings, ring);
      }
    }
    for (auto& ranges : steps) {
      std::sort(ranges.begin(), ranges.end());
      for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
          throw Error("ddl: plan rings with a rank in common share tag steps");
        }
      }
    }
    std::vector<Held> all;
    for (const auto& h : holdings) all.insert(all.end(), h.begin(), h.end());
    std::sort(all.begin(), all.end(),
              [](const Held& a, const Held& b) { return a.begin < b.begin; });
    size_t at = lane.range.offset;
    for (const Held& h : all) {
      if (h.begin != at || h.weight != size) {
        throw Error("ddl: plan leaves elements [" + std::to_string(h.begin) + ", " +
                    std::to_string(h.end) + ") with a sum over " + std::to_string(h.weight) +
                    " of " + std::to_string(size) + " ranks, or held twice");
      }
      at = h.end;
    }
    if (at != lane.range.offset + lane.range.length) {
      throw Error("ddl: plan leaves elements from " + std::to_string(at) + " unreduced");
    }
  }
  if (covered != plan.count) throw Error("ddl: plan lanes do not cover the buffer");
}

}  // namespace ddl
