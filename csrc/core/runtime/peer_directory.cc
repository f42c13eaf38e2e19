#include "peer_directory.h"

#include <algorithm>
#include <exception>
#include <functional>

#include "../base/status.h"

namespace ddl {

std::shared_ptr<PeerDirectory> PeerDirectory::of(const std::vector<std::string>& addresses) {
  auto directory = std::make_shared<PeerDirectory>();
  for (size_t r = 0; r < addresses.size(); ++r) {
    directory->learn(static_cast<int>(r), addresses[r]);
  }
  return directory;
}

namespace {

// Runs a lookup in the store, whose failures (torch's own exceptions where the store is torch's)
// become a ddl::Error naming the ranks: the one error the directory's callers take.
template <typename Lookup>
auto inStore(const std::string& ranks, Lookup lookup) {
  try {
    return lookup();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();  // the first line: torch's carry a backtrace
    throw Error("ddl: the address of " + ranks +
                " could not be looked up in the store: " + what.substr(0, what.find('\n')));
  }
}

// The lookups of a directory derived from `parent`, whose rank r is `there(r)` there (-1: one
// it may not reach): one rank at a time, or all at once in one bulk request of the parent's.
void lookUpThrough(const std::shared_ptr<PeerDirectory>& parent, std::function<int(int)> there,
                   PeerDirectory::Lookup* lookup, PeerDirectory::BulkLookup* bulk) {
  *lookup = [parent, there](int rank) {
    return there(rank) >= 0 ? parent->address(there(rank)) : std::string();
  };
  *bulk = [parent, there](const std::vector<int>& ranks) {
    std::vector<int> asked;
    for (int r : ranks) {
      if (there(r) >= 0) asked.push_back(there(r));
    }
    parent->prefetch(asked);
    std::vector<std::string> found;
    for (int r : ranks) found.push_back(there(r) >= 0 ? parent->known(there(r)) : std::string());
    return found;
  };
}

}  // namespace

std::string PeerDirectory::address(int rank) {
  Lookup lookup;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = byRank_.find(rank);
    if (it != byRank_.end()) return it->second;
    lookup = lookup_;
  }
  if (!lookup) return "";
  // Outside the lock: it may wait for the store.
  std::string found = inStore("rank " + std::to_string(rank), [&] { return lookup(rank); });
  learn(rank, found);
  return found;
}

std::string PeerDirectory::known(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = byRank_.find(rank);
  return it == byRank_.end() ? std::string() : it->second;
}

void PeerDirectory::learn(int rank, const std::string& address) {
  if (address.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = byRank_.emplace(rank, address);
  if (!added) {
    if (it->second == address) return;
    byAddress_.erase(it->second);
    it->second = address;
  }
  byAddress_[address] = rank;
}

void PeerDirectory::prefetch(const std::vector<int>& ranks) {
  std::vector<int> missing;
  BulkLookup bulk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int r : ranks) {
      if (byRank_.count(r) == 0 && std::find(missing.begin(), missing.end(), r) == missing.end()) {
        missing.push_back(r);
      }
    }
    bulk = bulk_;
  }
  if (missing.empty()) return;
  if (!bulk) {
    for (int r : missing) address(r);
    return;
  }
  const std::vector<std::string> found =
      inStore(std::to_string(missing.size()) + " ranks", [&] { return bulk(missing); });
  for (size_t i = 0; i < missing.size() && i < found.size(); ++i) learn(missing[i], found[i]);
}

int PeerDirectory::rankAt(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = byAddress_.find(address);
  return it == byAddress_.end() ? -1 : it->second;
}

std::vector<std::pair<int, std::string>> PeerDirectory::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int, std::string>> out(byRank_.begin(), byRank_.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::shared_ptr<PeerDirectory> PeerDirectory::only(const std::shared_ptr<PeerDirectory>& parent,
                                                   RankSet members) {
  auto view = std::make_shared<PeerDirectory>();
  for (const auto& [r, address] : parent->entries()) {
    if (members.contains(r)) view->learn(r, address);
  }
  auto kept = std::make_shared<const RankSet>(std::move(members));
  lookUpThrough(
      parent, [kept](int r) { return kept->contains(r) ? r : -1; }, &view->lookup_, &view->bulk_);
  return view;
}

std::shared_ptr<PeerDirectory> PeerDirectory::renumbered(
    const std::shared_ptr<PeerDirectory>& parent, RankSet members) {
  auto view = std::make_shared<PeerDirectory>();
  for (const auto& [r, address] : parent->entries()) {
    if (const int i = members.indexOf(r); i >= 0) view->learn(i, address);
  }
  auto order = std::make_shared<const RankSet>(std::move(members));
  lookUpThrough(
      parent, [order](int r) { return r >= 0 && r < order->size() ? order->at(r) : -1; },
      &view->lookup_, &view->bulk_);
  return view;
}

}  // namespace ddl
