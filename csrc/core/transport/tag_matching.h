// Tag matching as UCX does it, for the transports that hand whole messages over inside one
// process (loopback/, sim/): a new receive takes the oldest matching message that arrived with no
// receive posted, an arriving message the oldest matching receive, and (as the transports deliver
// one sender's messages in send order) messages from one sender match in send order.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "transport.h"

namespace ddl {

struct Delivered {
  uint64_t tag = 0;
  std::vector<char> bytes;  // empty when the message carries none (a simulation's sizes only)
  size_t size = 0;
};

class TagMatcher {
 public:
  // Matches with the oldest unexpected message, or posts the receive.
  void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req);
  // Matches with the oldest unexpected message; false (nothing posted) when none matches.
  bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req);
  // Matches with the oldest posted receive, or keeps the message as unexpected.
  void arrive(Delivered message);
  // Fails a posted receive ("cancelled"); false when it is not posted here.
  bool cancel(Request* req);
  // Takes a posted receive back without completing it; false when it is not posted here.
  bool withdraw(Request* req);
  // Drops the unexpected messages that match.
  void discard(uint64_t tag, uint64_t mask);

 private:
  struct Posted {
    uint64_t tag;
    uint64_t mask;
    void* data;
    size_t capacity;
    Request* req;
  };
  static void complete(const Posted& recv, const Delivered& message);
  std::deque<Delivered> unexpected_;
  std::deque<Posted> posted_;
};

}  // namespace ddl
