// Group creation over the group's own messages, with no rank that hears from every other. A rank
// finds in the store only what it needs before it can talk to anyone: the group's id and its
// predecessor's address (a handful of store requests per rank, all served by the one store
// server). The rest travels between ranks at distances 2^k, as far as each needs:
//
// 1. Every rank publishes its address and reads its predecessor's (rank r - 1's; the last rank
//    also rank 0's), so a simulator that creates its ranks in order never waits for a key.
// 2. Neighbours: each rank sends its card (RankCard: address, process identity, locality,
//    whether its engine holds a live group with the same id) to its predecessor, which answers
//    with its own: every rank knows both ring neighbours (r - 1 and r + 1, mod P).
// 3. Pointer doubling: knowing the ranks at distance d each way, a rank tells each of them the
//    other's address, and so learns the ranks at distance 2d: after ceil(log2 P) - 1 rounds of
//    two messages each way, every rank knows the ranks at distances 1, 2, 4, ... each way (its
//    fingers), 2 log2(P) addresses, and no other. They are the peers it talks to most: its
//    heartbeats and news, the binomial trees of creation, broadcasts, reductions and notices,
//    recursive doubling and Bruck's rounds, and a regular machine's rings.
// 4. Up the binomial tree (parent r - lowbit(r), children r + 2^k: fingers), each rank sends
//    what its subtree's ranks found of the machine (a Span: the hosts and racks of a range of
//    consecutive ranks as runs of equal blocks, the ranks whose engine holds the id, the first
//    error), and, up to kMaxListed hosts, each host's name and a hash of its locality: O(1)
//    bytes for a regular machine beyond that, O(distinct runs) otherwise.
// 5. Down: rank 0 makes the machine (the levels, as runs), draws the group's incarnation, and
//    every rank passes it on (or why the group cannot be made). Up to kMaxListed hosts, rank 0
//    finds hosts as buildTopology does, from the listed localities: by name and memory, never
//    by rank order (a host's ranks placed apart are one host, held rank by rank), names and
//    racks included. Beyond that a host is a run of consecutive ranks whose localities match
//    (as launchers place them: ranks of one host placed apart would be hosts of their own, and
//    take messages between them), named by its ranks.
// 6. Within each host: the ranks' process identities, along the host's ranks and back, so that
//    each rank watches its host's processes (runtime/liveness.h).
// Any other peer's address is looked up in the store when a rank first sends to it
// (runtime/peer_directory.h). Each message is a length (8 bytes), then that many bytes.
#pragma once

#include <memory>
#include <string>
#include <utility>
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

// Every rank's address, identity and the machine, from every rank's card: what a group made from
// handles every rank was given (torch's reconfigure) knows.
struct GroupDirectory {
  std::vector<std::string> addresses;   // by rank
  std::vector<std::string> identities;  // by rank
  Topology topology;
  // Why the group cannot be made (ok: it can); every such reason is one of the job's making (ids,
  // rack maps): kInvalidArgument.
  Status error;
};
GroupDirectory directoryFrom(const std::vector<RankCard>& cards, const RackMap& racks,
                             uint32_t groupId);

// What a rank knows once the exchange is done.
struct Bootstrapped {
  Topology topology;
  uint64_t incarnation = 0;  // Group::incarnation, drawn by rank 0
  // The process identities of this rank's host's other ranks (encoded), by rank.
  std::vector<std::pair<int, std::string>> hostIdentities;
  // Why the group cannot be made, the same on every rank (ok: it can).
  Status error;
};

// A host whose first rank lies in a span (below): its name and a hash of its locality.
struct SpanHost {
  std::string name;
  uint64_t key = 0;
  bool operator==(const SpanHost&) const = default;
};

// A range of consecutive ranks as step 4 sums it up. Each level is the blocks of the range as
// runs of equal sizes; `continues` says whether the range's first block holds ranks before it.
struct Span {
  struct Runs {
    bool continues = false;
    std::vector<std::pair<int, int>> runs;  // {block size, blocks}
  };
  using Host = SpanHost;
  int first = 0, count = 0;
  Runs hosts, racks;
  bool listsHosts = true;  // hostList holds every host that starts in the span, in order
  std::vector<Host> hostList;
  static constexpr size_t kMaxListed = 4096;
  bool racked = false;       // the rack map names racks (every rank sees the same map)
  std::vector<int> idTaken;  // ranks whose engine holds the id (the first kMaxNamed)
  int idTakenCount = 0;
  std::string error;  // the lowest rank's
  static constexpr int kMaxNamed = 32;
  // The span of one rank: whether it is on its predecessor's host and in its rack, and its host.
  static Span of(int rank, bool sameHost, bool sameRack, bool racked, bool idTaken,
                 std::string error, Host host = {});
  // This span followed by `next`, the range right after it.
  void append(const Span& next);
};

// The wire forms (bootstrap_wire.cc), for tests and fuzzing: false where the bytes are not whole
// or do not hold.
std::string encodeCards(const std::vector<RankCard>& cards);
bool decodeCards(const std::string& bytes, std::vector<RankCard>* cards);
// (rank, text) pairs: addresses in step 3, identities in step 6. Ranks below `size`.
std::string encodeEntries(const std::vector<std::pair<int, std::string>>& entries);
bool decodeEntries(const std::string& bytes, int size,
                   std::vector<std::pair<int, std::string>>* entries);
std::string encodeSpan(const Span& span);
bool decodeSpan(const std::string& bytes, int size, Span* span);
std::string encodeMachine(const Bootstrapped& machine);
bool decodeMachine(const std::string& bytes, int size, Bootstrapped* machine);
// The machine a whole group's span describes (step 5): its levels, or why it cannot be made.
Bootstrapped machineFrom(const Span& whole, int size, uint32_t groupId, const RackMap& racks);

// A framed message of `slot` between two ranks of an op: a length (8 bytes), then that many bytes.
// A receive of a length over `most` fails naming the sender, before anything is allocated.
Task sendFramed(Op& op, int peer, uint64_t slot, std::string bytes);
Task receiveFramed(Op& op, int peer, uint64_t slot, uint64_t most, std::string* bytes);
// What one rank's part of a creation message may take (its card, its address, its runs): a UCX
// worker address with every transport is a few KiB.
constexpr uint64_t kMaxCardBytes = 64 * 1024;

// The tree's parent of `rank` (-1 for rank 0) and its children, in the order they are awaited.
int bootstrapParent(int rank);
std::vector<int> bootstrapChildren(int rank, int size);

// Steps 2 to 6 as an operation of `group`, whose directory knows the predecessor's address
// (and rank 0's, on the last rank). `racks` is the rack map every rank was given. `out` is
// filled once the op succeeds; the group's directory learns the fingers on the way. `refusal`:
// why this rank cannot be of the group ("" where it can), which becomes every rank's error.
Task bootstrapGroup(Op& op, std::shared_ptr<Group> group, RankCard mine, std::string refusal,
                    std::shared_ptr<const RackMap> racks, std::shared_ptr<Bootstrapped> out);

}  // namespace ddl
