// Group creation over the group's own messages. A rank finds in the store only what it needs
// before it can talk to anyone: the group's id and its tree parent's address (a handful of store
// requests per rank, O(P) in all, where reading every rank's keys would be O(P^2), all served by
// the one store server). The rest travels up and down a binomial tree rooted at rank 0, as NCCL
// bootstraps over a ring:
//
// 1. Every rank publishes its address and reads its parent's: rank r's parent is r & (r - 1),
//    a lower rank, so a simulator that creates its ranks in order never waits for a key.
// 2. Up: each rank waits for its children's cards (RankCard: address, process identity,
//    locality, whether its engine holds a live group with the same id), adds its own and sends
//    them on to its parent. Children are r + 2^k for 2^k below r's lowest set bit (all powers
//    of two for rank 0), so a rank talks to at most log2(P) + 1 others.
// 3. Down: rank 0 builds the topology from every locality (and the rack map) and sends back
//    every rank's address and identity and the topology — or why the group cannot be made —
//    and each rank passes that on to its children. Every rank thus plans on one topology.
// Each message is a length (8 bytes), then that many bytes; 2 log2(P) rounds in all.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../base/task.h"
#include "../runtime/op.h"
#include "../topology/topology.h"

namespace ddl {

struct RankCard {
  int rank = 0;
  std::string address;
  std::string identity;  // ProcessIdentity::encode(), "" where it means nothing (a simulation)
  std::string locality;  // Locality::encode()
  bool idTaken = false;  // this rank's engine holds a live group with the new group's id
};

// What every rank knows once the group is made.
struct GroupDirectory {
  std::vector<std::string> addresses;   // by rank
  std::vector<std::string> identities;  // by rank
  Topology topology;
  uint64_t incarnation = 0;  // Group::incarnation, drawn by rank 0
  // Why the group cannot be made, the same on every rank (ok: it can). It travels as its words;
  // every such reason is one of the job's making (ids, rack maps): kInvalidArgument.
  Status error;
};

// Rank 0's part of step 3: the directory from every card (by rank), or its error.
GroupDirectory directoryFrom(const std::vector<RankCard>& cards, const RackMap& racks,
                             uint32_t groupId);

// A framed message of `slot` between two ranks of an op: a length (8 bytes), then that many bytes.
// A receive of a length over `most` fails naming the sender, before anything is allocated.
Task sendFramed(Op& op, int peer, uint64_t slot, std::string bytes);
Task receiveFramed(Op& op, int peer, uint64_t slot, uint64_t most, std::string* bytes);
// What one rank's part of a creation message may take (its card, or its address, identity and
// place in the directory): a UCX worker address with every transport is a few KiB.
constexpr uint64_t kMaxCardBytes = 64 * 1024;

// Cards and directories as they travel (tests and fuzzing): false where the bytes are not whole.
std::string encodeCards(const std::vector<RankCard>& cards);
bool decodeCards(const std::string& bytes, std::vector<RankCard>* cards);
std::string encodeDirectory(const GroupDirectory& directory);
bool decodeDirectory(const std::string& bytes, int size, GroupDirectory* directory);

// The tree's parent of `rank` (-1 for rank 0) and its children, in the order they are awaited.
int bootstrapParent(int rank);
std::vector<int> bootstrapChildren(int rank, int size);

// Steps 2 and 3 as an operation of `group` (whose addresses hold the parent's). `racks` is
// used at rank 0 only. `out` is filled once the op succeeds; `group` learns its children's
// addresses on the way.
Task bootstrapGroup(Op& op, std::shared_ptr<Group> group, RankCard mine, RackMap racks,
                    std::shared_ptr<GroupDirectory> out);

}  // namespace ddl
