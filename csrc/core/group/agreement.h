// Groups made of another group's ranks, without the store and without the ranks left out:
// shrink (torch's shrink_group: the survivors of a failed group go on) and split (a subset that
// asks for itself). The new group's ranks agree, over messages between themselves alone, on
// what they were asked (every rank must have been asked the same) and on an id no live group of
// theirs holds; addresses, process identities, the machine and the link figures come from the
// parent, and endpoints the parent opened are used again.
//
// The agreement is a tree exchange like creation's (bootstrap.h) over the new group's ranks:
// cards go up to its rank 0, which compares every rank's request with its own and picks the
// highest id free on every rank (the store hands out ids from the bottom: the two meet only
// when thousands of groups live at once, and then the creation that meets a held id refuses
// with the holder named); the answer comes back down. Its messages travel under the group id
// tag::kAgreementGroup, which no group holds, sequence from (parent, call, calls before), so none
// of the parent (whose failed ops' leftovers are being discarded) can be taken for them.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../base/task.h"
#include "../runtime/op.h"

namespace ddl {

struct DeriveCard {
  int rank = 0;         // in the new group
  int parentRank = 0;   // in the parent, for messages
  std::string request;  // what this rank was asked, as text ("exclude 2, 3"): equal everywhere
  std::string heldIds;  // a byte per group id, 1 where this rank's engine holds it
};

struct DeriveResult {
  Status error;  // the same on every rank (ok: agreed)
  uint32_t id = 0;
  int heardFrom = -1;  // the agreement failed on the word of this (parent) rank
  std::string mine;    // "rank 2 was asked to exclude 3": what this rank was asked
  std::string asked;   // "; " + mine once it failed on another rank's word ("" otherwise)
};

// Rank 0's decision from every card (by new rank). `what` names the call for messages.
DeriveResult decideDerived(const std::vector<DeriveCard>& cards, const std::string& what);

// The agreement as an op of the parent's ranks and addresses under id tag::kAgreementGroup:
// messages name parent ranks, so that ranks asked for different groups still meet and tell.
// `members`: the new group's ranks (parent ranks, by new rank), as this rank was asked; the
// ranks left out are never contacted. `out` is set once the op succeeds.
// A member's agreement that fails (a member gone, a timeout) would leave the others waiting for
// it until their own timeout: each member also listens for a word from any other, and ends at
// once with it. The failed member tells its neighbours in the tree (tellNeighbours), and each
// one told tells its own, also the one whose word it had (that word may have come from a rank
// of another view, which still waits): O(P) messages, each neighbour sent to by an op of its
// own (one gone fails only its own). A shrink's members first tell the ranks they leave out
// (Communicator::agree), so that views that differ in who leads them meet as well.
Task agreeOnDerived(Op& op, std::vector<int> members, DeriveCard mine, std::string what,
                    std::shared_ptr<DeriveResult> out, std::vector<std::shared_ptr<Work>> told = {},
                    TimePoint toldBy = TimePoint::max());
// agreeOnDerived as an op of `agreement` (id tag::kAgreementGroup) under `sequence`, submitted
// now: its Work ends when the agreement has, `out` holding the decision (an error the same on
// every member, or the id). `told`: the Works of words this rank sent first (a shrink's to the
// ranks it leaves out), waited for until `toldBy`. When it fails here, the neighbours are told
// at once (tellNeighbours) with its error and, when it failed on another rank's word, what this
// rank was asked.
std::shared_ptr<Work> startAgreement(const std::shared_ptr<Group>& agreement, uint32_t sequence,
                                     const std::vector<int>& members, DeriveCard mine,
                                     const std::string& what, std::chrono::milliseconds timeout,
                                     std::vector<std::shared_ptr<Work>> told, TimePoint toldBy,
                                     std::shared_ptr<DeriveResult> out);
void tellNeighbours(const Group& agreement, uint32_t sequence, const std::vector<int>& members,
                    int index, std::string text, std::chrono::milliseconds timeout);
// Sends `text` as the agreement's word of failure to each of `ranks` (of the agreement's group),
// each by an op of its own over `endpoints` (by rank; the agreement's when empty): one that is
// gone fails its own alone. Returns the ops' Works, for a caller that waits for them.
std::vector<std::shared_ptr<Work>> tellRanks(const Group& agreement, uint32_t sequence,
                                             const std::vector<int>& ranks, std::string text,
                                             std::chrono::milliseconds timeout,
                                             const std::vector<PeerId>& endpoints = {});

}  // namespace ddl
