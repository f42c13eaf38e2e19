// UCX UCP transport: one context and one worker per process, tag-matching API with non-blocking
// *_nbx calls. UCX picks shared memory / CMA between processes of a host and TCP (or InfiniBand
// where built in) between hosts.
//
// Addresses carry a host key (hostname and network namespace) before the worker address.
// Endpoints to other hosts use UCX peer error handling: a peer whose connection fails (its process
// died or exited: the kernel closes its sockets; or its link is lost: UCX's keepalive, every
// kKeepaliveSeconds) fails the requests posted to it and is reported by lostPeers(), which the
// engine turns into failed operations naming it. Same-host endpoints do not: UCX offers no
// shared-memory transport under that mode and would fall back to TCP over loopback; a dead local
// peer is reported by the engine's pidfd watch (runtime/liveness.h).
#pragma once

#include <ucp/api/ucp.h>

#include <map>
#include <string>
#include <vector>

#include "../transport.h"

namespace ddl {

class UcxTransport : public Transport {
 public:
  UcxTransport();
  ~UcxTransport() override;

  std::string localAddress() override { return address_; }
  PeerId connect(const std::string& address) override;
  void send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) override;
  void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override;
  void cancel(Request* req) override;
  void discard(uint64_t tag, uint64_t mask) override;
  bool progress() override;
  bool arm() override;
  int wakeFd() override { return wakeFd_; }
  uint64_t allocateWindow(size_t bytes, void** base, std::string* key) override;
  uint64_t mapWindow(PeerId peer, const std::string& key, void** base, size_t* bytes) override;
  void releaseWindow(uint64_t id) override;
  uint64_t registerRegion(void* base, size_t bytes, std::string* key) override;
  uint64_t openRegion(PeerId peer, const std::string& key) override;
  void put(PeerId peer, uint64_t remote, size_t offset, const void* data, size_t bytes,
           Request* req) override;
  void flush(PeerId peer, Request* req) override;
  void closeRegion(uint64_t id) override;
  std::vector<std::pair<PeerId, std::string>> lostPeers() override;
  std::string addressOf(PeerId peer) const override {
    return peer >= 0 && static_cast<size_t>(peer) < endpoints_.size() ? endpoints_[peer]->address
                                                                      : "";
  }
  std::string name() const override;
  std::vector<std::string> devices() const override;
  size_t endpoints() const override { return endpoints_.size(); }

  static std::string version();

 private:
  struct Endpoint {
    UcxTransport* transport = nullptr;
    PeerId id = -1;
    std::string address;
    ucp_ep_h ep = nullptr;
    ucs_status_t failure = UCS_OK;  // set by the error handler when the peer is gone
  };
  struct Window {
    ucp_mem_h memory = nullptr;  // allocated here
    ucp_rkey_h rkey = nullptr;   // a peer's, mapped here
  };
  // A region registered here for peers' puts, or a peer's opened here to put into.
  struct Region {
    ucp_mem_h memory = nullptr;
    ucp_rkey_h rkey = nullptr;
    uint64_t remoteBase = 0;
    size_t bytes = 0;
    PeerId peer = -1;
  };
  // Fails `req` (true) when `peer` is not an endpoint or its connection failed.
  bool unreachable(PeerId peer, Request* req);
  // Keys of windows and regions (base, length, packed remote key), and their remote key unpacked
  // for `peer` (false when it cannot be).
  static std::string packedKey(const void* base, size_t bytes, const void* packed,
                               size_t packedLength);
  bool unpackKey(PeerId peer, const std::string& key, uint64_t header[2], ucp_rkey_h* rkey);
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static std::string hostKey();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int wakeFd_ = -1;
  std::map<std::string, PeerId> ids_;
  std::vector<Endpoint*> endpoints_;
  std::map<uint64_t, Window> windows_;
  uint64_t nextWindow_ = 1;
  std::map<uint64_t, Region> regions_;
  uint64_t nextRegion_ = 1;
  // Remote keys closed while puts through them may still be in flight: each is destroyed once a
  // flush of its peer has completed (closeRegion).
  size_t keysFlushing_ = 0;
  static void keyFlushed(void* ucxRequest, ucs_status_t status, void* user);
  std::vector<std::pair<PeerId, std::string>> lost_;  // since the last lostPeers()
  // Where discarded messages land (their contents are never read; several may land at once).
  std::vector<char> discardBuffer_ = std::vector<char>(64 * 1024);
  size_t discarding_ = 0;  // discards UCX has not finished
};

}  // namespace ddl
