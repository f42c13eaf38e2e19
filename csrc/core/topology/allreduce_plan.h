// Allreduce plans as data: which algorithm, and for the multi-dimensional ring every ring of every
// stage of every lane, computed by pure functions from the topology, then checked; a cost model
// predicts each candidate's time and the planner picks the cheapest. One file a job, as NCCL's
// graph/: links.cc (the figures and TORCH_DDL_LINKS), plan_build.cc (the builders),
// cost_model.cc (the prediction), plan_select.cc (the candidates and the choice), plan_check.cc
// (the replay), plan_holdings.cc (who holds what, for the builders and the check).
//
// Vocabulary (see ring_pipeline.h for chunk, segment and step):
//   dimension  a coordinate of the grid (topology.h): 0 within a host, 1 across the hosts of a
//              rack, 2 across racks. A dimension ring joins ranks that differ in it alone.
//   stage      one dimension's turn: every rank reduce-scatters what it owns with its ring of
//              that dimension; the allgather runs the stages backwards.
//   piece      a contiguous range owned by the same ranks of a ring (on a regular grid, the whole
//              of what each owns; uneven hosts cut it into several pieces, each its own ring).
//   lane       a contiguous share of the buffer walking the dimensions in one order: colour c
//              starts at dimension c (rotated order), so while one colour is on the host level
//              another is on the network; lanes of odd ring index run their rings backwards.
//   wave       a lane may be cut into waves that follow each other through the stages: wave w
//              starts a stage on a rank once wave w-1 has finished it there, so while one wave
//              is on the network another is on the host (a pipeline across levels).
//   phase      the tag phase of a lane (tag.h): lanes run at once, each in its own phase; within
//              a lane every ring has its own range of steps.
//
// Correctness does not rest on the grid being regular: the planner tracks, for every element,
// which ranks hold a partial sum of it and over how many ranks; a stage merges the holders within
// each ring; when the chosen order leaves some element with more than one holder (uneven hosts
// walked in a rotated order), a last stage over the whole group merges them. checkPlan replays
// the plan and demands exactly one holder of every element, holding the sum over all ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../base/algorithm.h"
#include "links.h"
#include "ring_plan.h"
#include "topology.h"

namespace ddl {

// One ring of one stage: it reduce-scatters a piece and, mirrored, gathers it back.
struct StageRing {
  std::vector<int> order;     // group ranks, by position
  std::vector<Range> chunks;  // by position: the part of the piece that position ends holding
  uint32_t firstStep = 0;     // tag steps [firstStep, firstStep + 2(n-1))
};
struct Stage {
  int dimension = 0;  // -1: the closing stage over the whole group
  std::vector<StageRing> rings;
  // Where the plan is checked (AllreducePlan::checked): by rank, the rings it is a member of,
  // in ring order, rings [memberFrom[r], memberFrom[r + 1]) of memberRings (indexMembers).
  std::vector<uint32_t> memberFrom;
  std::vector<uint32_t> memberRings;
};
// The rings of `stage` that `rank` is a member of, in ring order: from the index where there is
// one, by looking at every ring where not (a plan built by hand, not yet checked).
std::vector<uint32_t> ringsWith(const Stage& stage, int rank);
struct Lane {
  Range range;  // elements
  uint32_t phase = 0;
  bool reversed = false;      // rings run backwards
  std::vector<int> order;     // dimensions in the order of its reduce-scatter
  std::vector<Stage> stages;  // reduce-scatter stages; the allgather runs them backwards
  int after = -1;             // the lane (previous wave) that must finish each stage first
};

// kShared where the ranks cannot map each other's memory: recursive doubling up to this many
// bytes, the message ring above (as auto did on one host up to 64 KiB before the staged
// allreduce took 4 - 64 KiB).
inline constexpr size_t kUnsharedDoublingBytes = 64 << 10;

struct AllreducePlan {
  // kTrivial, kRecursiveDoubling, kLeaders, kRing, kShared, or kMultiDim (the stages above).
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kTrivial;
  size_t count = 0;
  size_t elementSize = 1;
  int colors = 1;
  int rings = 1;
  int waves = 1;
  std::vector<Lane> lanes;              // kMultiDim only
  std::vector<std::vector<int>> hosts;  // kLeaders: each host's ranks, its leader first
  std::vector<int> hostOf;              // kLeaders: each rank's index in `hosts`
  std::vector<int> leaders;             // kLeaders: each host's leader, in hosts' order
  // kMultiDim: the rings of the host level (dimension 0) run over shared-memory slots
  // (algorithms/slot_link.h) where their ranks can map each other's windows and the buffer is in
  // host memory; over messages otherwise.
  bool hostSlots = true;
  // kShared, kSharedRing, kDirect (algorithms/allreduce_shared.cc):
  // - asksDirect: the op first asks whether every rank's tensor is in a shared buffer, to take
  //   the direct path (kShared from request.directMinBytes on, and below while the group's last
  //   answer was yes; kDirect always);
  // - adopts: the op moves a block it is handed (CallOptions::adoptable) into shared memory
  //   (kShared and kDirect, where request.shareTensors);
  // - offersAdoption: callers that keep tensors (the torch glue) hand one: adopts, from
  //   directMinBytes on, unless the request forced kShared.
  // - staged: kShared where the direct path is not taken: the staged allreduce
  //   (algorithms/allreduce_staged.cc) up to request.stagedBytes, the shared-memory ring above.
  // - once: staged, and each rank's reads of the others' tensors ((P - 1) x the bytes) at most
  //   request.onceBytes: once the staging buffers are set up, in one step (allreduceOnce), its
  //   call checked through them instead of a print (CallCheck::defer).
  // - doublesUnshared: where the ranks cannot map each other's memory (another host, a container
  //   of its own, UCX without shared memory), recursive doubling instead of the message ring
  //   (kShared up to kUnsharedDoublingBytes).
  bool asksDirect = false;
  bool staged = false;
  bool once = false;
  bool doublesUnshared = false;
  bool adopts = false;
  bool offersAdoption = false;
  // kMultiDim over the machine with these dimensions split in two (splitDimension, topology.h),
  // innermost first. The lanes' orders and stages count the dimensions of the split machine.
  struct Split {
    int dimension;  // of the machine
    int inner;      // blocks of its first rings
    int outer;      // blocks of its second rings
  };
  std::vector<Split> splits;
  double predicted = 0;  // seconds, by the cost model
  // Made by the planner, which checks what it makes and indexes its stages' members (a plan
  // built by hand is checked by the communicator it is given to, and not indexed).
  bool checked = false;

  // "multidim colors=2 rings=1 waves=4 order=0,1" etc. (and " split2=16x16" for each split)
  std::string describe() const;
};

// How an allgather runs (algorithms/allgather_*.cc, priced in cost_model.h): the flat ring, the
// level-by-level rings of the grid, Bruck's logarithmic rounds over all ranks, or Bruck's rounds
// level by level over the grid.
enum class AllgatherSchedule { kRing, kGrid, kBruck, kGridBruck };
// How an all_to_all runs: every pair at once (algorithms/alltoall_pairwise.cc), or Bruck's
// ceil(log2 P) rounds (alltoall_bruck.cc).
enum class AlltoallSchedule { kPairwise, kBruck };
// How a gather runs: every rank sends its block to the root at once
// (algorithms/gather_scatter_linear.cc), or a binomial tree (gather_tree.cc).
enum class GatherSchedule { kLinear, kTree };

// What the configuration asks for (TORCH_DDL_ALLREDUCE_ALGO and its knobs). Zero: the planner
// chooses.
struct PlanRequest {
  // kAuto: the cheapest; else that algorithm's plan.
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  int colors = 0;
  int rings = 0;
  std::vector<int> order;  // dimensions of colour 0 (empty: innermost first)
  int waves = 0;
  size_t smallBytes = 4096;  // one host, auto: recursive doubling up to this size
  int ringRings = 1;         // rings of the flat ring (TORCH_DDL_RINGS)
  bool hostSlots = true;     // multidim: the host level over shared memory (TORCH_DDL_HOST_SLOTS)
  size_t directMinBytes = 1 << 20;  // kShared: asks for the direct path from here (the default
                                    // of TORCH_DDL_DIRECT_MIN_BYTES)
  bool shareTensors = true;         // TORCH_DDL_SHARE_TENSORS
  size_t stagedBytes = 512 << 10;   // kShared: staged up to this size (TORCH_DDL_STAGED_BYTES)
  size_t onceBytes = 64 << 10;      // and in one step while (P - 1) x the bytes is at most this
                                    // (TORCH_DDL_ONCE_BYTES; auto, one host: rather than recursive
                                    // doubling; 0: never)
  // Allgathers: the schedule forced, else the cheapest (PlanBook::allgatherSchedule). kGrid and
  // kGridBruck (TORCH_DDL_ALLGATHER_ALGO ring and bruck) run flat where there are no block
  // stages; kRing and kBruck run flat whatever the machine.
  std::optional<AllgatherSchedule> allgather;
  // All-to-alls: the schedule forced (TORCH_DDL_ALLTOALL_ALGO), else PlanBook::alltoallSchedule.
  std::optional<AlltoallSchedule> alltoall;
  // Gathers: the schedule forced (TORCH_DDL_GATHER_ALGO), else PlanBook::gatherSchedule.
  std::optional<GatherSchedule> gather;
};
// What the configuration asks of the planner (the process's configuration by default): the one
// place that reads the settings that choose an allreduce.
struct Config;
PlanRequest planRequest(const Config& settings);
PlanRequest planRequest();

// The multi-dimensional plan: `colors` lanes walking rotated orders, each split into `rings`
// lanes whose odd members run backwards, each cut into `waves`. `order` lists dimensions for
// colour 0 (missing ones are appended, innermost first; dimensions of extent 1 are skipped).
AllreducePlan planMultiDim(const Topology& topology, size_t count, size_t elementSize, int colors,
                           int rings, const std::vector<int>& order = {}, int waves = 1);
// The plan the group runs for `count` elements: what `request` forces, else the candidate the
// cost model finds cheapest (on one host: recursive doubling up to smallBytes, then kShared, as
// before the planner; across hosts: recursive doubling, flat rings and multi-dimensional plans of
// 1..dims colours, 1..2 rings and 1, 2, 4 or 8 waves, each predicted with `links`).
AllreducePlan planAllreduce(const Topology& topology, const LinkCosts& links, size_t count,
                            size_t elementSize, const PlanRequest& request);
// The order the planner ranks candidates by their predictions: the cheapest first, where one
// within 0.1 % of the cheapest left counts as its equal and the earlier (simpler) of equals
// goes first. Each place is taken against the cheapest of what is left: "within 0.1 % of each
// other" is not transitive, and a sort by it let a chain of such ties put a plan 0.16 % dearer
// first (65 536 ranks, 100 MB).
std::vector<size_t> cheapestFirst(const std::vector<double>& predicted);
// Every candidate the planner weighs for this size (with predictions), the chosen one first.
std::vector<AllreducePlan> allreduceCandidates(const Topology& topology, const LinkCosts& links,
                                               size_t count, size_t elementSize,
                                               const PlanRequest& request);

// Throws ddl::Error unless every ring is a permutation of distinct group ranks, its chunks tile
// its piece, steps fit the tag and do not overlap within a lane, phases are distinct and fit,
// lanes tile [0, count), and replaying the plan leaves every element with one holder of the sum
// over every rank.
void checkPlan(const AllreducePlan& plan, int size);
// Fills every stage's member index (Stage::memberFrom) for a group of `size` ranks: a rank then
// finds its rings in O(its rings), not O(the group's), on every op.
void indexMembers(AllreducePlan& plan, int size);

// Whether some rank of a multidim plan talks to more than `most` distinct peers (its rings'
// neighbours). O(P most) memory: a rank's count stops once over.
bool talksToMoreThan(const AllreducePlan& plan, int size, int most);
// Whether a multidim plan merges what its stages left over in a closing stage over the whole
// group (an irregular machine's).
bool needsClosingStage(const AllreducePlan& plan);
// The tag steps the busiest lane of a multidim plan needs (checkPlan refuses more than
// tag::kMaxSteps).
uint64_t stepsNeeded(const AllreducePlan& plan);

}  // namespace ddl
