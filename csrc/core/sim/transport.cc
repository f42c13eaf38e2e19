// The Transport of one simulated rank (network.h): matching as UCX's, one-sided puts and
// flushes over the network's lanes, lost peers as the network tells them.
#include <cstring>

#include "../base/types.h"
#include "network.h"

namespace ddl {

PeerId SimTransport::connect(const std::string& address) {
  int rank = -1;
  if (address.rfind("sim:", 0) == 0) rank = std::atoi(address.c_str() + 4);
  if (rank < 0 || rank >= network_->size()) {
    throw Error("ddl: no simulated rank at address '" + address + "'");
  }
  auto it = byRank_.find(rank);
  if (it != byRank_.end()) return it->second;
  const PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(rank);
  byRank_.emplace(rank, id);
  network_->connected(rank_, rank);
  return id;
}

void SimTransport::send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) {
  network_->send(rank_, peers_.at(peer), tag, data, bytes, req);
}

void SimTransport::recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) {
  matcher_.recv(tag, mask, data, bytes, req);
}

bool SimTransport::receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                                  Request* req) {
  return matcher_.receiveArrived(tag, mask, data, bytes, req);
}

void SimTransport::cancel(Request* req) {
  if (matcher_.cancel(req)) return;
  const auto id = reinterpret_cast<uint64_t>(req->transportData);
  auto it = flushes_.find(id);
  if (id != 0 && it != flushes_.end() && it->second.req == req) {
    flushes_.erase(it);
    req->fail(StatusKind::kCancelled, "cancelled");
  }
}

void SimTransport::discard(uint64_t tag, uint64_t mask) { matcher_.discard(tag, mask); }

bool SimTransport::progress() {
  bool any = false;
  if (!sentDone_.empty()) {
    std::vector<Request*> done;
    done.swap(sentDone_);
    for (Request* req : done) req->complete();
    any = true;
  }
  if (!flushesDone_.empty()) {
    std::vector<Request*> done;
    done.swap(flushesDone_);
    for (Request* req : done) req->complete();
    any = true;
  }
  if (!inbox_.empty()) {
    std::vector<Delivered> arrived;
    arrived.swap(inbox_);
    network_->charge(static_cast<double>(inboxOverheadNs_) * 1e-9);
    inboxOverheadNs_ = 0;
    for (Delivered& message : arrived) matcher_.arrive(std::move(message));
    any = true;
  }
  return any;
}

uint64_t SimTransport::allocateWindow(size_t bytes, void** base, std::string* key) {
  if (!network_->spec().windows || !network_->payload()) return 0;
  std::shared_ptr<char[]> memory(new char[std::max<size_t>(bytes, 1)]);
  *key = network_->offerWindow(rank_, memory, bytes);
  *base = memory.get();
  windows_.emplace(nextWindow_, std::move(memory));
  return nextWindow_++;
}

uint64_t SimTransport::mapWindow(PeerId, const std::string& key, void** base, size_t* bytes) {
  if (!network_->payload()) return 0;
  std::shared_ptr<char[]> memory = network_->findWindow(rank_, key, bytes);
  if (!memory) return 0;
  *base = memory.get();
  windows_.emplace(nextWindow_, std::move(memory));
  return nextWindow_++;
}

uint64_t SimTransport::registerRegion(void* base, size_t bytes, std::string* key) {
  const uint64_t id = nextRegion_++;
  regions_[id] = Region{static_cast<char*>(base), bytes};
  *key = "sim:" + std::to_string(rank_) + ":" + std::to_string(id);
  return id;
}

uint64_t SimTransport::openRegion(PeerId peer, const std::string& key) {
  const int rank = peers_.at(static_cast<size_t>(peer));
  const std::string prefix = "sim:" + std::to_string(rank) + ":";
  if (key.rfind(prefix, 0) != 0 || key.size() == prefix.size() || key.size() > prefix.size() + 20 ||
      key.find_first_not_of("0123456789", prefix.size()) != std::string::npos) {
    return 0;  // not a region of that peer's
  }
  const uint64_t id = nextRegion_++;
  opened_[id] = Opened{rank, std::stoull(key.substr(prefix.size()))};
  return id;
}

void SimTransport::put(PeerId peer, uint64_t remote, size_t offset, const void* data, size_t bytes,
                       Request* req) {
  auto it = opened_.find(remote);
  if (it == opened_.end() || it->second.rank != peers_.at(static_cast<size_t>(peer))) {
    req->fail(StatusKind::kInvalidArgument, "ddl: a put through a region not opened to that peer");
    return;
  }
  network_->put(rank_, it->second.rank, it->second.region, offset, data, bytes, req);
}

void SimTransport::flush(PeerId peer, Request* req) {
  const uint64_t id = nextFlush_++;
  const int rank = peers_.at(static_cast<size_t>(peer));
  flushes_[id] = Flush{rank, req};
  req->transportData = reinterpret_cast<void*>(id);
  network_->flush(rank_, rank, id);
}

void SimTransport::closeRegion(uint64_t id) {
  regions_.erase(id);
  opened_.erase(id);
}

void SimTransport::land(uint64_t region, size_t offset, const std::vector<char>& bytes,
                        size_t size) {
  auto it = regions_.find(region);
  if (it == regions_.end() || offset > it->second.bytes || size > it->second.bytes - offset) {
    ++strayPuts_;
    return;
  }
  if (!bytes.empty()) std::memcpy(it->second.base + offset, bytes.data(), bytes.size());
}

void SimTransport::flushed(uint64_t id) {
  auto it = flushes_.find(id);
  if (it == flushes_.end()) return;  // cancelled meanwhile
  flushesDone_.push_back(it->second.req);
  flushes_.erase(it);
}

void SimTransport::lost(int peerRank, const std::string& why) {
  // Flushes to a peer lost are never answered.
  for (auto it = flushes_.begin(); it != flushes_.end();) {
    if (it->second.rank == peerRank) {
      it->second.req->status =
          Status(StatusKind::kPeerLost,
                 "ddl: a flush to rank " + std::to_string(peerRank) + " failed: " + why);
      flushesDone_.push_back(it->second.req);  // completed as the rank turns
      it = flushes_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = byRank_.find(peerRank);
  // Told without an endpoint (a pidfd of a process on this host): one for the report.
  const PeerId id = it != byRank_.end() ? it->second : connect("sim:" + std::to_string(peerRank));
  lost_.emplace_back(id, why);
}

std::vector<std::pair<PeerId, std::string>> SimTransport::lostPeers() {
  std::vector<std::pair<PeerId, std::string>> lost;
  lost.swap(lost_);
  return lost;
}

}  // namespace ddl
