#include "loopback.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "../../base/types.h"

namespace ddl {

std::unique_ptr<LoopbackTransport> LoopbackFabric::join() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto transport = std::make_unique<LoopbackTransport>(this, static_cast<int>(members_.size()));
  members_.push_back(transport.get());
  return transport;
}

int LoopbackFabric::find(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] != nullptr && members_[i]->localAddress() == address) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

LoopbackTransport::LoopbackTransport(LoopbackFabric* fabric, int index)
    : fabric_(fabric), index_(index), eventFd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

LoopbackTransport::~LoopbackTransport() {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  fabric_->members_[index_] = nullptr;
  close(eventFd_);
}

std::string LoopbackTransport::localAddress() { return "loopback:" + std::to_string(index_); }

PeerId LoopbackTransport::connect(const std::string& address) {
  auto it = peerIds_.find(address);
  if (it != peerIds_.end()) return it->second;
  const int peer = fabric_->find(address);
  if (peer < 0) throw Error("ddl: no loopback transport at address " + address);
  PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(peer);
  peerIds_.emplace(address, id);
  return id;
}

std::string LoopbackTransport::addressOf(PeerId peer) const {
  for (const auto& [address, id] : peerIds_) {
    if (id == peer) return address;
  }
  return "";
}

uint64_t LoopbackTransport::allocateWindow(size_t bytes, void** base, std::string* key) {
  if (refuseWindows_) return 0;
  std::shared_ptr<char[]> memory(new char[std::max<size_t>(bytes, 1)]);
  {
    std::lock_guard<std::mutex> lock(fabric_->mutex_);
    std::erase_if(fabric_->windows_, [](const auto& w) { return w.second.memory.expired(); });
    *key = "window:" + std::to_string(fabric_->nextKey_++);
    fabric_->windows_[*key] = {memory, bytes};
  }
  *base = memory.get();
  windows_.emplace(nextWindow_, std::move(memory));
  return nextWindow_++;
}

uint64_t LoopbackTransport::mapWindow(PeerId, const std::string& key, void** base, size_t* bytes) {
  if (refuseWindows_) return 0;
  std::shared_ptr<char[]> memory;
  {
    std::lock_guard<std::mutex> lock(fabric_->mutex_);
    auto it = fabric_->windows_.find(key);
    if (it != fabric_->windows_.end()) {
      memory = it->second.memory.lock();
      *bytes = it->second.bytes;
    }
  }
  if (!memory) return 0;
  *base = memory.get();
  windows_.emplace(nextWindow_, std::move(memory));
  return nextWindow_++;
}

void LoopbackTransport::releaseWindow(uint64_t id) { windows_.erase(id); }

uint64_t LoopbackTransport::registerRegion(void* base, size_t bytes, std::string* key) {
  if (bytes == 0) return 0;
  uint64_t header[2] = {reinterpret_cast<uint64_t>(base), bytes};
  key->assign(reinterpret_cast<const char*>(header), sizeof(header));
  regions_.emplace(nextRegion_, std::make_pair(static_cast<char*>(base), bytes));
  return nextRegion_++;
}

uint64_t LoopbackTransport::openRegion(PeerId, const std::string& key) {
  uint64_t header[2];
  if (key.size() != sizeof(header)) return 0;
  std::memcpy(header, key.data(), sizeof(header));
  regions_.emplace(nextRegion_, std::make_pair(reinterpret_cast<char*>(header[0]), header[1]));
  return nextRegion_++;
}

void LoopbackTransport::put(PeerId, uint64_t remote, size_t offset, const void* data, size_t bytes,
                            Request* req) {
  auto it = regions_.find(remote);
  if (it == regions_.end() || offset > it->second.second || bytes > it->second.second - offset) {
    req->fail(StatusKind::kInvalidArgument, "the put falls outside the peer's region");
    return;
  }
  if (bytes > 0) std::memcpy(it->second.first + offset, data, bytes);
  req->complete();
}

void LoopbackTransport::send(PeerId peer, uint64_t tag, const void* data, size_t bytes,
                             Request* req) {
  Delivered message{tag, std::vector<char>(bytes), bytes};
  if (bytes > 0) std::memcpy(message.bytes.data(), data, bytes);
  const int to = peers_.at(peer);
  bool delivered = false;
  {
    // Under the fabric's lock, which a transport's destructor takes: the receiver cannot go
    // away during delivery.
    std::lock_guard<std::mutex> lock(fabric_->mutex_);
    LoopbackTransport* receiver = fabric_->members_.at(static_cast<size_t>(to));
    if (receiver != nullptr) {
      receiver->deliver(std::move(message));
      delivered = true;
    }
  }
  // A destroyed receiver fails the send, as UCX's to a process that is gone.
  if (!delivered) {
    req->fail(StatusKind::kPeerLost, "loopback:" + std::to_string(to) + " is gone");
    return;
  }
  req->complete();
}

void LoopbackTransport::deliver(Delivered message) {
  {
    std::lock_guard<std::mutex> lock(inboxMutex_);
    inbox_.push_back(std::move(message));
  }
  uint64_t one = 1;
  (void)!write(eventFd_, &one, sizeof(one));
}

void LoopbackTransport::recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) {
  matcher_.recv(tag, mask, data, bytes, req);
}

bool LoopbackTransport::receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                                       Request* req) {
  return matcher_.receiveArrived(tag, mask, data, bytes, req);
}

void LoopbackTransport::discard(uint64_t tag, uint64_t mask) { matcher_.discard(tag, mask); }

void LoopbackTransport::cancel(Request* req) {
  if (!deferCancels_) {
    matcher_.cancel(req);
  } else if (matcher_.withdraw(req)) {
    cancelled_.push_back(req);
  }
}

bool LoopbackTransport::progress() {
  uint64_t counter;
  (void)!read(eventFd_, &counter, sizeof(counter));
  std::deque<Delivered> arrived;
  {
    std::lock_guard<std::mutex> lock(inboxMutex_);
    arrived.swap(inbox_);
  }
  for (Delivered& message : arrived) matcher_.arrive(std::move(message));
  std::vector<Request*> cancelled = std::move(cancelled_);
  cancelled_.clear();
  for (Request* req : cancelled) req->fail(StatusKind::kCancelled, "cancelled");
  return !arrived.empty() || !cancelled.empty();
}

bool LoopbackTransport::arm() {
  if (!cancelled_.empty()) return false;
  std::lock_guard<std::mutex> lock(inboxMutex_);
  return inbox_.empty();
}

}  // namespace ddl
