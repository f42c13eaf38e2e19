#include "tag_matching.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "../base/tag.h"

namespace ddl {
namespace {

using Index = TagMatcher::Index;

// The first arrival in `index` under `key` still waiting (entries taken another way dropped).
uint64_t front(Index& index, uint64_t key, const std::map<uint64_t, Delivered>& waiting) {
  auto it = index.find(key);
  if (it == index.end()) return UINT64_MAX;
  Fifo<uint64_t>& q = it->second;
  while (!q.empty() && !waiting.count(q.front())) q.pop_front();
  if (q.empty()) {
    index.erase(it);
    return UINT64_MAX;
  }
  return q.front();
}

// Drops `arrival` from the front of `index` under `key` where it stands there.
void drop(Index& index, uint64_t key, uint64_t arrival) {
  auto it = index.find(key);
  if (it == index.end()) return;
  if (!it->second.empty() && it->second.front() == arrival) it->second.pop_front();
  if (it->second.empty()) index.erase(it);
}

}  // namespace

void TagMatcher::complete(const Posted& recv, const Delivered& message) {
  recv.req->senderTag = message.tag;
  recv.req->receivedBytes = std::min(message.size, recv.capacity);
  if (message.size > recv.capacity) {
    recv.req->fail(StatusKind::kTruncated, "message truncated: " + std::to_string(message.size) +
                                               " bytes arrived for a " +
                                               std::to_string(recv.capacity) + "-byte receive");
    return;
  }
  if (!message.bytes.empty()) std::memcpy(recv.data, message.bytes.data(), message.size);
  recv.req->complete();
}

TagMatcher::TagMatcher()
    : indices_{{tag::kMatchAll, {}},
               {tag::kAnySource, {}},
               {tag::kGroupAndSlot, {}},
               {tag::kGroupAndSequence, {}}} {}

TagMatcher::Index* TagMatcher::indexFor(uint64_t mask) {
  for (MaskIndex& m : indices_) {
    if (m.mask == mask) return &m.index;
  }
  // A wide group's (base/tag.h): indexed from its first use, over what waits now.
  bool wide = false;
  for (int w = 1; w <= tag::kWideBits; ++w) {
    wide = wide || mask == tag::anySource(w) || mask == tag::groupAndSlot(w) ||
           mask == tag::groupAndSequence(w);
  }
  if (!wide) return nullptr;
  indices_.push_back({mask, {}});
  Index& index = indices_.back().index;
  for (const auto& [arrival, message] : waiting_) index[message.tag & mask].push_back(arrival);
  return &index;
}

std::map<uint64_t, Delivered>::iterator TagMatcher::findWaiting(uint64_t tag, uint64_t mask) {
  if (Index* index = indexFor(mask)) {
    const uint64_t arrival = front(*index, tag & mask, waiting_);
    return arrival == UINT64_MAX ? waiting_.end() : waiting_.find(arrival);
  }
  return std::find_if(waiting_.begin(), waiting_.end(),
                      [&](const auto& entry) { return (entry.second.tag & mask) == (tag & mask); });
}

void TagMatcher::take(std::map<uint64_t, Delivered>::iterator it) {
  const uint64_t arrival = it->first, t = it->second.tag;
  for (MaskIndex& m : indices_) drop(m.index, t & m.mask, arrival);
  waiting_.erase(it);
}

bool TagMatcher::receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                                Request* req) {
  auto it = findWaiting(tag, mask);
  if (it == waiting_.end()) return false;
  Delivered message = std::move(it->second);
  take(it);
  complete(Posted{tag, mask, data, bytes, req, 0}, message);
  return true;
}

void TagMatcher::recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) {
  if (receiveArrived(tag, mask, data, bytes, req)) return;
  const Posted posted{tag, mask, data, bytes, req, posts_++};
  if (mask == tag::kMatchAll) {
    req->senderTag = tag;  // where withdraw() finds it; a match sets the same
    PostedQueue& q = exact_[tag];
    if (q.any) {
      q.rest.push_back(posted);
    } else {
      q.first = posted;
      q.any = true;
    }
  } else {
    masked_.push_back(posted);
  }
  ++postedCount_;
}

void TagMatcher::arrive(Delivered message) {
  // The oldest posted receive it matches: of those posted for its tag exactly, and of the masked.
  PostedQueue* exact = exact_.find(message.tag);
  const uint64_t exactOrder = exact != nullptr ? exact->first.order : UINT64_MAX;
  auto masked = std::find_if(masked_.begin(), masked_.end(), [&](const Posted& r) {
    return (message.tag & r.mask) == (r.tag & r.mask);
  });
  const uint64_t maskedOrder = masked != masked_.end() ? masked->order : UINT64_MAX;
  if (exactOrder == UINT64_MAX && maskedOrder == UINT64_MAX) {
    const uint64_t arrival = arrivals_++;
    for (MaskIndex& m : indices_) m.index[message.tag & m.mask].push_back(arrival);
    waiting_.emplace(arrival, std::move(message));
    return;
  }
  Posted recv;
  if (exactOrder < maskedOrder) {
    recv = exact->first;
    if (!exact->dropFirst()) exact_.erase(message.tag);
  } else {
    recv = *masked;
    masked_.erase(masked);
  }
  --postedCount_;
  complete(recv, message);
}

bool TagMatcher::withdraw(Request* req) {
  auto masked =
      std::find_if(masked_.begin(), masked_.end(), [req](const Posted& r) { return r.req == req; });
  if (masked != masked_.end()) {
    masked_.erase(masked);
    --postedCount_;
    return true;
  }
  // An exact receive's request holds its tag while posted (what a match sets it to).
  PostedQueue* q = exact_.find(req->senderTag);
  if (q == nullptr) return false;
  if (q->first.req == req) {
    if (!q->dropFirst()) exact_.erase(req->senderTag);
  } else {
    auto it = std::find_if(q->rest.begin(), q->rest.end(),
                           [req](const Posted& r) { return r.req == req; });
    if (it == q->rest.end()) return false;
    q->rest.erase(it);
  }
  --postedCount_;
  return true;
}

bool TagMatcher::cancel(Request* req) {
  if (!withdraw(req)) return false;
  req->fail(StatusKind::kCancelled, "cancelled");
  return true;
}

void TagMatcher::discard(uint64_t tag, uint64_t mask) {
  for (auto it = findWaiting(tag, mask); it != waiting_.end(); it = findWaiting(tag, mask)) {
    take(it);
  }
}

}  // namespace ddl
