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
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "../base/clock.h"
#include "../base/rank_set.h"
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
  uint64_t incarnation = 0;  // the new group's (Group::incarnation), drawn by the new rank 0
  int heardFrom = -1;        // the agreement failed on the word of this (parent) rank
  std::string mine;          // "rank 2 was asked to exclude 3": what this rank was asked
  std::string asked;         // "; " + mine once it failed on another rank's word ("" otherwise)
};

// Cards as they travel (a count, then each card): false where the bytes are not whole cards, or
// a card takes more than `most` bytes, names a rank past the largest group or more group ids
// than there are. A card's bytes beyond its two texts: kCardOverhead.
constexpr size_t kCardOverhead = 32;
std::string encodeCards(const std::vector<DeriveCard>& cards);
bool decodeCards(const std::string& bytes, size_t most, std::vector<DeriveCard>* cards);

// Rank 0's decision from every card (by new rank). `what` names the call for messages.
DeriveResult decideDerived(const std::vector<DeriveCard>& cards, const std::string& what);

// One agreement, as this rank runs it.
struct Agreement {
  // Over the parent's ranks under id tag::kAgreementGroup: messages name parent ranks, so that
  // ranks asked for different groups still meet and tell. `group` holds the addresses of the
  // members alone (the agreement fails as soon as one of them is known gone), `everyone` every
  // rank's (for words of failure).
  std::shared_ptr<Group> group;
  std::shared_ptr<Group> everyone;
  uint32_t sequence = 0;
  // Words of failure carry it; an agreement drops words of an attempt that ended here before
  // (`ended`, the engine's: the turning thread's), so that a reconfigure retried with the same
  // handles (the same sequence) never takes the failed attempt's words, and heeds those of an
  // attempt it never ran (another view's).
  uint64_t attempt = 0;
  std::set<uint64_t>* ended = nullptr;
  RankSet members = RankSet::listed({});  // the new group's ranks (parent ranks, by new rank),
                                          // as asked here
  std::vector<int> excluded;              // the ranks this rank's request leaves out (a shrink's)
  std::string what;
  std::chrono::milliseconds timeout{0};
};

// The agreement as an op of agreement.group. The ranks left out are never contacted by it.
// `out` is set once the op succeeds. A member's agreement that fails (a member gone, views that
// differ, a timeout) would leave the others waiting until their own timeout: each member also
// listens for a word from any other, and ends at once with it. A member whose agreement fails
// sends its words to the ranks at distances 1, 2, 4, ... after it (of the parent's, but those
// its request leaves out): each rank hears from log2(P) others, whatever view it holds, so a
// dead rank or another view's tree cuts no one off, and each one told tells its own: P log2(P)
// messages, each by an op of its own (one gone fails only its own). A member that receives
// cards asking for another group fails at once (it need not wait for the root). A shrink's
// members first tell the ranks they leave out (Derivation::start), so that views
// that differ in who leads them meet as well.
Task agreeOnDerived(Op& op, Agreement agreement, DeriveCard mine, std::shared_ptr<DeriveResult> out,
                    std::vector<std::shared_ptr<Work>> told = {},
                    TimePoint toldBy = TimePoint::max());
// agreeOnDerived as an op, submitted now: its Work ends when the agreement has, `out` holding
// the decision (an error the same on every member, or the id). `told`: the Works of words this
// rank sent first (a shrink's, to the ranks it leaves out), waited for until `toldBy`. When it
// fails here, the others are told at once (above) with its error and, when it failed on another
// rank's word, what this rank was asked.
std::shared_ptr<Work> startAgreement(const Agreement& agreement, DeriveCard mine,
                                     std::vector<std::shared_ptr<Work>> told, TimePoint toldBy,
                                     std::shared_ptr<DeriveResult> out);
// The ranks a failure is passed on to from `rank` of a group of `size`: those at distances
// 1, 2, 4, ... after it among the ranks not `leftOut` (each that hears does the same, so every
// one of them hears, whichever ranks left out sit between).
std::vector<int> successorsAmong(int rank, int size, const std::vector<int>& leftOut);

// Sends `text` as the agreement's word of failure (of `kind`) to each of `ranks` (parent
// ranks), each by an op of its own over `endpoints` (by rank; agreement.everyone's when empty):
// one that is gone fails its own alone. Returns the ops' Works, for a caller that waits for
// them.
std::vector<std::shared_ptr<Work>> tellRanks(const Agreement& agreement,
                                             const std::vector<int>& ranks, std::string text,
                                             const std::unordered_map<int, PeerId>& endpoints = {},
                                             StatusKind kind = StatusKind::kOther);

}  // namespace ddl
