// The transport interface every algorithm is written against: post a tagged send, post a tagged
// receive, drive progress, and (optionally) share memory windows with peers on the same host. Tags
// carry the source rank (see base/tag.h), so receives need no peer handle and "any source" is a
// mask. Every method except wakeFd() is called from the thread that turns the runtime only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../base/status.h"

namespace ddl {

struct Request;

// Called by a transport when a request finishes (done == true, status set).
using RequestObserver = void (*)(Request*);

// One posted send or receive. Owned by the engine; the transport only fills in the result.
struct Request {
  bool done = false;
  Status status;             // once done: ok, or why it failed
  size_t receivedBytes = 0;  // receives: bytes that arrived
  // Receives: the exact size the receiver expects (kAnySize: up to the buffer). A message of
  // another size fails the op: the ranks disagree on what they called.
  static constexpr size_t kAnySize = ~size_t{0};
  size_t expectedBytes = kAnySize;
  uint64_t senderTag = 0;  // receives: the full tag of the message matched
  int peer = -1;           // group rank of the other side (for error messages)
  bool isSend = false;
  bool isCallPrint = false;  // the op's call check (runtime/call_print.h), not the op's data
  void* owner = nullptr;     // the engine's operation waiting on it (nullptr once orphaned)
  RequestObserver observer = nullptr;
  // Whoever holds the request for the engine's operation (an algorithm's link) may ask to be
  // told too: the engine calls consumer(consumerContext) when it completes.
  void (*consumer)(void* context) = nullptr;
  void* consumerContext = nullptr;
  void* transportData = nullptr;

  bool failed() const { return !status.ok(); }
  void complete() {
    done = true;
    if (observer != nullptr) observer(this);
  }
  void fail(StatusKind kind, std::string message) {
    status = Status(kind, std::move(message));
    complete();
  }
};

using PeerId = int;

class Transport {
 public:
  virtual ~Transport() = default;

  // Opaque bytes that another process passes to connect() to reach this one.
  virtual std::string localAddress() = 0;
  // Endpoints are keyed by address: connecting twice to one address returns the same PeerId.
  virtual PeerId connect(const std::string& address) = 0;
  // The address an endpoint was opened to.
  virtual std::string addressOf(PeerId peer) const = 0;

  virtual void send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) = 0;
  virtual void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) = 0;
  // Stops a posted request; it then completes (failed) through the observer, now or later.
  virtual void cancel(Request* req) = 0;

  // Drives communication; returns true when something happened.
  virtual bool progress() = 0;
  // Prepares to sleep on wakeFd(). False means events are pending: call progress() again.
  virtual bool arm() = 0;
  // A file descriptor that becomes readable when progress() has work (-1: always poll).
  virtual int wakeFd() = 0;

  // Shared windows (optional). A window is memory allocated by this process that a peer process
  // on the same host can map and then address directly: bytes written through the mapping move
  // in user space, with no message and no kernel copy. allocateWindow returns an id (0: the
  // transport has none) and fills the base address and a key for the peer; mapWindow, given a
  // peer's key, returns an id (0: that peer's window cannot be addressed from here, e.g. it is on
  // another host), the local address of the peer's window and its length (what a peer's offer says
  // of the window is checked against it before any byte is written). releaseWindow undoes either; a
  // mapping stays valid until it is released, even after the owner released its window (as shared
  // memory between processes does), so a peer that leaves early cannot pull memory from under a
  // writer.
  virtual uint64_t allocateWindow(size_t /*bytes*/, void** /*base*/, std::string* /*key*/) {
    return 0;
  }
  virtual uint64_t mapWindow(PeerId /*peer*/, const std::string& /*key*/, void** /*base*/,
                             size_t* /*bytes*/) {
    return 0;
  }
  virtual void releaseWindow(uint64_t /*id*/) {}

  // One-sided puts (optional): a peer writes into memory of this process with no receive posted
  // here. registerRegion exposes [base, base + bytes) (any memory the process holds) and returns
  // an id (0: the transport has no puts, or cannot register it) and a key for peers; openRegion,
  // given a peer's key, returns an id to put through (0: it cannot). put writes `bytes` of `data`
  // at `offset` of the peer's region `remote` (an openRegion id) and completes `req` once the
  // source may be reused; flush completes `req` once every put posted to `peer` before it has
  // landed there (what a message sent after it may then announce). closeRegion undoes either.
  virtual uint64_t registerRegion(void* /*base*/, size_t /*bytes*/, std::string* /*key*/) {
    return 0;
  }
  virtual uint64_t openRegion(PeerId /*peer*/, const std::string& /*key*/) { return 0; }
  virtual void put(PeerId /*peer*/, uint64_t /*remote*/, size_t /*offset*/, const void* /*data*/,
                   size_t /*bytes*/, Request* req) {
    req->fail(StatusKind::kOther, "the transport " + name() + " has no one-sided puts");
  }
  virtual void flush(PeerId /*peer*/, Request* req) { req->complete(); }
  virtual void closeRegion(uint64_t /*id*/) {}

  // Starts receiving a message that has arrived for `tag` under `mask` with no receive posted
  // for it, into `data`, completing `req` as recv does; false when none has arrived. For rare
  // messages (a group's notices): a receive posted under a mask is searched by every message
  // that arrives, this costs nothing until it is called.
  virtual bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                              Request* req) = 0;

  // Receives and drops the messages that arrived for `tag` under `mask` with no receive posted
  // for them (left behind by an operation that failed before it posted its receives).
  virtual void discard(uint64_t /*tag*/, uint64_t /*mask*/) {}

  // Peers the transport found gone since the last call (their connection failed: the process
  // died or exited, or its link was lost), each with what the transport saw.
  virtual std::vector<std::pair<PeerId, std::string>> lostPeers() { return {}; }

  virtual std::string name() const = 0;
  // "transport/device" pairs the transport can use, for diagnostics.
  virtual std::vector<std::string> devices() const { return {}; }
  // Endpoints opened so far (connect() calls with a new address).
  virtual size_t endpoints() const = 0;
};

}  // namespace ddl
