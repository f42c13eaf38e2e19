// Host groups (Scenario::hostOps): every host of two or more ranks splits off a group of its own
// from the world group, as a job that reduces within each host first does (HSDP's groups of one
// host), every rank calling once per host, in host order. Their allreduces take the paths of one
// host: in shared memory where the world has it (ClusterSpec::sharedMemory), in one step, on the
// caller's thread where it waits at once (group/quick.cc).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cluster.h"

namespace ddl {

class HostGroups {
 public:
  // Forms them over `cluster`'s world group: "" where every one formed, else why one did not.
  std::string form(SimCluster& cluster, std::chrono::milliseconds limit);
  // Each group's communicators, by cluster rank (null: not a member), in host order.
  const std::vector<std::vector<std::shared_ptr<Communicator>>>& groups() const { return groups_; }

 private:
  std::vector<std::vector<std::shared_ptr<Communicator>>> groups_;
};

// The communicators of `groups` (by cluster rank; null stays null), as SimCluster::run takes them.
std::vector<Communicator*> rawMembers(const std::vector<std::shared_ptr<Communicator>>& groups);

}  // namespace ddl
