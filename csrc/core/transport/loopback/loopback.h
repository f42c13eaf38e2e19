// In-process transport for unit tests: every rank is a thread of one process, a send copies the
// bytes into the receiver's inbox at once; matching follows UCX's rules (tag_matching.h).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../tag_matching.h"
#include "../transport.h"

namespace ddl {

class LoopbackTransport;

// The shared "wire": the transports of one test, indexed by address.
class LoopbackFabric {
 public:
  std::unique_ptr<LoopbackTransport> join();
  // The index of the transport at `address`, or -1.
  int find(const std::string& address);

 private:
  friend class LoopbackTransport;
  std::mutex mutex_;
  std::vector<LoopbackTransport*> members_;  // null once a transport is destroyed
  // Shared windows by key: memory lives while its owner or a mapping holds it, as shared memory
  // does between processes.
  struct Shared {
    std::weak_ptr<char[]> memory;
    size_t bytes = 0;
  };
  std::map<std::string, Shared> windows_;
  uint64_t nextKey_ = 0;
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(LoopbackFabric* fabric, int index);
  ~LoopbackTransport() override;

  std::string localAddress() override;
  PeerId connect(const std::string& address) override;
  void send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) override;
  void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  void cancel(Request* req) override;
  void discard(uint64_t tag, uint64_t mask) override;
  bool progress() override;
  bool arm() override;
  int wakeFd() override { return eventFd_; }
  std::string name() const override { return "loopback"; }
  size_t endpoints() const override { return peers_.size(); }
  std::string addressOf(PeerId peer) const override;
  // Windows are heap memory of the one process, found through the fabric by key. refuseWindows
  // (true) makes this transport behave as one whose peers cannot map each other (tests of the
  // fallback).
  uint64_t allocateWindow(size_t bytes, void** base, std::string* key) override;
  uint64_t mapWindow(PeerId peer, const std::string& key, void** base, size_t* bytes) override;
  void releaseWindow(uint64_t id) override;
  void refuseWindows(bool refuse) { refuseWindows_ = refuse; }
  // Regions are memory of the one process: a put copies into it at once.
  uint64_t registerRegion(void* base, size_t bytes, std::string* key) override;
  uint64_t openRegion(PeerId peer, const std::string& key) override;
  void put(PeerId peer, uint64_t remote, size_t offset, const void* data, size_t bytes,
           Request* req) override;
  void closeRegion(uint64_t id) override { regions_.erase(id); }
  // deferCancels(true): a cancelled receive completes at the next progress() rather than inside
  // cancel(), as UCX's may (tests of ops that fail with receives still held).
  void deferCancels(bool defer) { deferCancels_ = defer; }
  size_t windowsInUse() const { return windows_.size(); }

 private:
  void deliver(Delivered message);  // called by other ranks' threads

  LoopbackFabric* fabric_;
  int index_;
  int eventFd_;
  std::mutex inboxMutex_;
  std::deque<Delivered> inbox_;
  // Touched by the owning progress thread only.
  TagMatcher matcher_;
  std::map<std::string, PeerId> peerIds_;
  std::vector<int> peers_;  // fabric indices: a peer may be destroyed while this one sends
  std::map<uint64_t, std::shared_ptr<char[]>> windows_;  // allocated or mapped here
  uint64_t nextWindow_ = 1;
  std::map<uint64_t, std::pair<char*, size_t>> regions_;  // registered or opened here
  uint64_t nextRegion_ = 1;
  bool refuseWindows_ = false;
  bool deferCancels_ = false;
  std::vector<Request*> cancelled_;  // withdrawn, to fail at the next progress()
};

}  // namespace ddl
