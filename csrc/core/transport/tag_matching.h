// Tag matching as UCX does it, for the transports that hand whole messages over inside one
// process (loopback/, sim/): a new receive takes the oldest matching message that arrived with no
// receive posted, an arriving message the oldest matching receive, and (as the transports deliver
// one sender's messages in send order) messages from one sender match in send order.
//
// Indexed, so that thousands of messages waiting (an all_to_all of a thousand simulated ranks
// posts a thousand receives a rank) cost a lookup each, not a scan: posted receives by their
// exact tag (the masked ones, a few, in a list), messages waiting by their tag under each mask
// the engine uses (exact, any source, group and slot, group and sequence, and these of a wide
// group's once one asks: base/tag.h); others are scanned.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "../base/fifo.h"
#include "tag_table.h"
#include "transport.h"

namespace ddl {

struct Delivered {
  uint64_t tag = 0;
  std::vector<char> bytes;  // empty when the message carries none (a simulation's sizes only)
  size_t size = 0;
};

class TagMatcher {
 public:
  using Index = std::unordered_map<uint64_t, Fifo<uint64_t>>;  // arrivals by masked tag
  TagMatcher();
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
  // Messages waiting for a receive, receives waiting for a message.
  size_t unexpected() const { return waiting_.size(); }
  size_t posted() const { return postedCount_; }

 private:
  struct Posted {
    uint64_t tag;
    uint64_t mask;
    void* data;
    size_t capacity;
    Request* req;
    uint64_t order;  // when it was posted
  };
  static void complete(const Posted& recv, const Delivered& message);
  // The oldest waiting message under `mask` matching `tag` (waiting_.end(): none).
  std::map<uint64_t, Delivered>::iterator findWaiting(uint64_t tag, uint64_t mask);
  void take(std::map<uint64_t, Delivered>::iterator it);
  // The index of waiting messages under `mask`, if it is one kept (null: scan).
  Index* indexFor(uint64_t mask);
  // The receives posted for one exact tag, oldest first: the first held in place (one at a time
  // is the rule), any others behind it.
  struct PostedQueue {
    Posted first{};
    bool any = false;
    Fifo<Posted> rest;
    // The next one moves up; false where none is left (the queue is then taken out).
    bool dropFirst() {
      if (rest.empty()) return false;
      first = rest.front();
      rest.pop_front();
      return true;
    }
  };
  // Posted receives: exact tags by tag (in post order), masked ones in post order.
  TagTable<PostedQueue> exact_;
  std::vector<Posted> masked_;
  uint64_t posts_ = 0;
  size_t postedCount_ = 0;
  // Messages with no receive yet, by arrival, and indices of their arrivals by masked tag
  // (entries of messages taken another way are dropped when met).
  std::map<uint64_t, Delivered> waiting_;
  uint64_t arrivals_ = 0;
  struct MaskIndex {
    uint64_t mask;
    Index index;
  };
  std::vector<MaskIndex> indices_;  // exact, any source, group and slot, group and sequence; wide
};

}  // namespace ddl
