// Group creation through the store, in two halves (group/bootstrap.h), so that a driver that
// must not block (a simulator turning every rank's engine on one thread) runs it as it runs
// collectives: begin() makes the store requests, which read only keys of lower ranks, and starts
// the exchange over the group's own messages; once work() is done, finish() makes the
// communicator, or throws why it could not. Communicator::create is the two halves with a wait
// between (await()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "../runtime/work.h"
#include "../topology/allreduce_plan.h"
#include "../topology/links.h"
#include "../topology/topology.h"
#include "bootstrap.h"
#include "store.h"

namespace ddl {

class Communicator;
class Engine;
struct Group;

// How a group is made, beyond its store, rank and size.
struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Tests: the machine the group believes it runs on, instead of the one its ranks find.
  const Topology* topology = nullptr;
  // Where this rank runs (default: Locality::self()), what identifies its process to peers on
  // its host (default: ProcessIdentity::self(); "" for none, as a simulated rank's), the rack
  // map and link figures (default: TORCH_DDL_TOPOLOGY's and TORCH_DDL_LINKS's; figures given
  // are not probed).
  std::optional<Locality> locality;
  std::optional<std::string> identity;
  std::optional<std::string> racks;
  std::optional<std::string> links;
  // What the planner is asked (default: the configuration's, topology's planRequest()).
  std::optional<PlanRequest> plan;
};

// A group id as rank 0 wrote it to the store (`key`): decimal, below tag::kGroupIds. Throws
// naming the key and the value otherwise.
uint32_t parseGroupId(const std::string& value, const std::string& key);

class Creation {
 public:
  // `store` is kept: a rank looks up in it the address of a peer it was not told of at creation
  // (bootstrap.h) when it first sends to it.
  static std::unique_ptr<Creation> begin(Engine& engine, std::shared_ptr<KeyValueStore> store,
                                         int rank, int size, const GroupOptions& options);
  Creation(const Creation&) = delete;
  Creation& operator=(const Creation&) = delete;
  ~Creation();  // gives the id back unless finish() handed it on

  // The creation op's.
  const std::shared_ptr<Work>& work() const { return work_; }
  // The second half, once work() is done.
  std::shared_ptr<Communicator> finish();
  // Waits for work(), then finish().
  std::shared_ptr<Communicator> await();

  // What the creation op found: the machine and the link figures to plan with.
  struct Found {
    Topology topology;
    LinkCosts links;
  };

 private:
  Creation() = default;

  Engine* engine_ = nullptr;
  std::shared_ptr<Group> group_;
  GroupOptions options_;
  std::shared_ptr<Work> work_;
  std::shared_ptr<Bootstrapped> bootstrapped_;
  std::shared_ptr<Found> found_;
  bool claimed_ = false;  // the group's id is claimed on the engine
};

}  // namespace ddl
