#include "tag_matching.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace ddl {

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

bool TagMatcher::receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                                Request* req) {
  auto it = std::find_if(unexpected_.begin(), unexpected_.end(),
                         [&](const Delivered& m) { return (m.tag & mask) == (tag & mask); });
  if (it == unexpected_.end()) return false;
  Delivered message = std::move(*it);
  unexpected_.erase(it);
  complete(Posted{tag, mask, data, bytes, req}, message);
  return true;
}

void TagMatcher::recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) {
  if (!receiveArrived(tag, mask, data, bytes, req)) {
    posted_.push_back(Posted{tag, mask, data, bytes, req});
  }
}

void TagMatcher::arrive(Delivered message) {
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const Posted& r) {
    return (message.tag & r.mask) == (r.tag & r.mask);
  });
  if (it == posted_.end()) {
    unexpected_.push_back(std::move(message));
    return;
  }
  const Posted recv = *it;
  posted_.erase(it);
  complete(recv, message);
}

bool TagMatcher::withdraw(Request* req) {
  auto it =
      std::find_if(posted_.begin(), posted_.end(), [&](const Posted& r) { return r.req == req; });
  if (it == posted_.end()) return false;
  posted_.erase(it);
  return true;
}

bool TagMatcher::cancel(Request* req) {
  if (!withdraw(req)) return false;
  req->fail(StatusKind::kCancelled, "cancelled");
  return true;
}

void TagMatcher::discard(uint64_t tag, uint64_t mask) {
  std::erase_if(unexpected_, [&](const Delivered& m) { return (m.tag & mask) == (tag & mask); });
}

}  // namespace ddl
