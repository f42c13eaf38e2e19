#include "host_groups.h"

namespace ddl {

std::string HostGroups::form(SimCluster& cluster, std::chrono::milliseconds limit) {
  const std::vector<int>& hostOf = cluster.layout().hostOf;
  const int n = cluster.size();
  for (int h = 0; h <= hostOf.back(); ++h) {
    std::vector<int> ranks;  // the world group's ranks are the cluster's
    for (int r = 0; r < n; ++r) {
      if (hostOf[r] == h) ranks.push_back(r);
    }
    if (ranks.size() < 2) continue;
    std::string error;
    std::vector<std::shared_ptr<Communicator>> groups =
        cluster.split(cluster.members(), limit, &error, ranks);
    for (int r : ranks) {
      if (groups[r] == nullptr) {
        return "host " + std::to_string(h) + "'s group did not form on rank " + std::to_string(r) +
               ": " + error;
      }
    }
    groups_.push_back(std::move(groups));
  }
  return "";
}

std::vector<Communicator*> rawMembers(const std::vector<std::shared_ptr<Communicator>>& groups) {
  std::vector<Communicator*> members;
  for (const auto& g : groups) members.push_back(g.get());
  return members;
}

}  // namespace ddl
