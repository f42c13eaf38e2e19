// Plans for one machine, one set of link figures and one planner request, shared by every group
// of the process that plans for the same: the thousands of ranks of a simulated cluster, or a
// process's subgroups of one shape. Plans are pure functions of these inputs, so each is computed
// once, by the first group that asks, and the topology is held once.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allreduce_plan.h"
#include "block_plan.h"
#include "cost_model.h"
#include "topology.h"

namespace ddl {

class PlanBook {
 public:
  // The book for these inputs: an existing one while any group holds it, else a new one.
  // `hierarchical`: block stages for reduce-scatter and allgather (else none: the flat ring).
  static std::shared_ptr<PlanBook> forMachine(Topology topology, LinkCosts links,
                                              PlanRequest request, bool hierarchical);

  const Topology& topology() const { return topology_; }
  const LinkCosts& links() const { return links_; }
  const PlanRequest& request() const { return request_; }
  bool hierarchical() const { return hierarchical_; }
  // The allreduce plan for `count` elements of `elementSize` bytes (the latest kCache sizes kept);
  // its `predicted` is the estimate of an allreduce of that size.
  std::shared_ptr<const AllreducePlan> allreduce(size_t count, size_t elementSize);
  // Every plan the planner weighs for that size, the chosen one first (not kept).
  std::vector<AllreducePlan> candidates(size_t count, size_t elementSize) const;
  // The level-by-level stages of reduce-scatter or allgather (empty: the flat ring).
  std::shared_ptr<const BlockPlan> blockStages(bool reduceScatter);
  // How an allgather of `bytes` per rank runs: what the request forces, else the cheapest by the
  // cost model of the rings (the grid's where there are block stages) and, for blocks up to
  // kBruckMaxBytes, Bruck's rounds over all ranks and level by level over the grid. A
  // reduce-scatter's (which runs it backwards) is priced as such.
  static constexpr size_t kBruckMaxBytes = 65536;
  AllgatherSchedule allgatherSchedule(size_t bytes, bool reduceScatter = false);
  // What the cost model prices that schedule at, in seconds.
  double allgatherPredicted(AllgatherSchedule schedule, size_t bytes, bool reduceScatter = false);
  // How an all_to_all runs: what the request forces, else Bruck's rounds from kBruckAlltoallRanks
  // ranks. Its layout may differ per rank, so the choice goes by the group's size alone, which
  // every rank agrees on. From there the pairwise exchange's endpoint to every rank and its P - 1
  // lookups each (P^2 keys at the store's one server: 2.6 s at 2 048 ranks, past the
  // heartbeat's timeout) cost more than Bruck's bytes, which cross ceil(log2 P) / 2 times as many
  // links.
  static constexpr int kBruckAlltoallRanks = 1024;
  AlltoallSchedule alltoallSchedule() const;
  // How a gather of `bytes` a rank runs: what the request forces, else the binomial tree from
  // kGatherTreeRanks ranks while the largest subtree a rank other than the root holds (at most
  // half the blocks) is at most kGatherTreeScratch bytes, else linear. The tree
  // costs ceil(log2 P) latencies where the linear gather's root meets P - 1 messages at once and
  // each of its senders looks the root's address up (P requests at the store's one server: 2 s
  // at 65 536 ranks, the heartbeats' timeout); the bytes into the root are the same.
  static constexpr int kGatherTreeRanks = 64;
  static constexpr size_t kGatherTreeScratch = size_t{256} << 20;
  GatherSchedule gatherSchedule(size_t bytes) const;
  // What the cost model prices Bruck's all_to_all of `bytes` a block at, in seconds.
  double alltoallBruckPredicted(size_t bytes);

  PlanBook(Topology topology, LinkCosts links, PlanRequest request, bool hierarchical);

 private:
  static constexpr size_t kCache = 256;
  std::shared_ptr<const AllgatherCosts> gatherCosts();  // computed once
  const Topology topology_;
  const LinkCosts links_;
  const PlanRequest request_;
  const bool hierarchical_;
  std::mutex mutex_;
  std::map<std::pair<size_t, size_t>, std::shared_ptr<const AllreducePlan>> plans_;
  std::shared_ptr<const BlockPlan> stages_[2];
  std::shared_ptr<const AllgatherCosts> allgatherCosts_;
};

}  // namespace ddl
