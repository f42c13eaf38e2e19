// Where the ranks of a group are reached: the addresses one rank knows, and how it looks up the
// others. A rank is told at creation the addresses of the peers it talks to most (its
// neighbours at distances 2^k each way: group/bootstrap.h), not every rank's; another peer's is
// looked up the first time this rank sends to it (in the store its group was created with), and
// kept. What a rank holds grows with the peers it talks to, not with the group.
//
// Which ranks a directory knows also says whom an op of its group can lose: the runtime fails an
// op when a peer it knows the address of is found gone (Runtime::lostPeerOf). A group made to
// talk to some ranks alone (an agreement's members, one rank told of a failure) holds a
// directory that knows and looks up those alone.
//
// Any thread: the progress thread learns and looks up, callers copy views for groups they make.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../base/rank_set.h"

namespace ddl {

class PeerDirectory {
 public:
  // The address of `rank`, or "" where it cannot be had; may block (a store's request). Throws
  // ddl::Error to say why it failed.
  using Lookup = std::function<std::string(int rank)>;

  // The addresses of several ranks at once (one request), in their order.
  using BulkLookup = std::function<std::vector<std::string>(const std::vector<int>& ranks)>;

  PeerDirectory() = default;
  explicit PeerDirectory(Lookup lookup, BulkLookup bulk = nullptr)
      : lookup_(std::move(lookup)), bulk_(std::move(bulk)) {}
  // One that knows every rank's address, by rank ("" for a rank it must not reach).
  static std::shared_ptr<PeerDirectory> of(const std::vector<std::string>& addresses);

  // The address of `rank`: the one known, else looked up now and kept; "" when neither.
  std::string address(int rank);
  // The address of `rank` if it is known here, else "" (no lookup).
  std::string known(int rank) const;
  void learn(int rank, const std::string& address);
  // Looks up those of `ranks` not known here, at once where it can (one request).
  void prefetch(const std::vector<int>& ranks);
  // The rank known at `address`, -1 for none.
  int rankAt(const std::string& address) const;
  // The addresses known here, by rank.
  std::vector<std::pair<int, std::string>> entries() const;

  // A directory of the same ranks as `parent` that knows and looks up `members` alone.
  static std::shared_ptr<PeerDirectory> only(const std::shared_ptr<PeerDirectory>& parent,
                                             RankSet members);
  // The directory of a group of `members` of `parent`'s, in that order (its rank i is
  // members.at(i) there): what `parent` knows of them, and lookups through it. Both walk what
  // `parent` knows, not the members (O(P) a rank, O(P^2) over a simulated group).
  static std::shared_ptr<PeerDirectory> renumbered(const std::shared_ptr<PeerDirectory>& parent,
                                                   RankSet members);

 private:
  mutable std::mutex mutex_;
  Lookup lookup_;
  BulkLookup bulk_;
  std::unordered_map<int, std::string> byRank_;
  std::unordered_map<std::string, int> byAddress_;
};

}  // namespace ddl
