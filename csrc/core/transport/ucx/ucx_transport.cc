#include "ucx_transport.h"

#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "../../base/types.h"

namespace ddl {
namespace {

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) {
    throw Error(std::string("ddl: UCX ") + what + " failed: " + ucs_status_string(status));
  }
}

// What a failed UCX request means for the op that posted it.
StatusKind kindOf(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CANCELED:
      return StatusKind::kCancelled;
    case UCS_ERR_MESSAGE_TRUNCATED:
      return StatusKind::kTruncated;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
      return StatusKind::kPeerLost;
    default:
      return StatusKind::kOther;
  }
}

void onSend(void* ucxRequest, ucs_status_t status, void* user) {
  auto* req = static_cast<Request*>(user);
  req->transportData = nullptr;
  ucp_request_free(ucxRequest);
  if (status == UCS_OK) {
    req->complete();
  } else {
    req->fail(kindOf(status), ucs_status_string(status));
  }
}

void finishRecv(Request* req, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  if (info != nullptr) {
    req->receivedBytes = info->length;
    req->senderTag = info->sender_tag;
  }
  if (status == UCS_OK) {
    req->complete();
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    req->fail(StatusKind::kTruncated,
              "message truncated: more bytes arrived than the receive expected");
  } else {
    req->fail(kindOf(status), ucs_status_string(status));
  }
}

// The parameters of a request that completes through onSend (sends, puts, flushes).
ucp_request_param_t sendParams(Request* req) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &onSend;
  p.user_data = req;
  return p;
}

// Such a request just started: done already, failed, or in flight.
void sendStarted(Request* req, ucs_status_ptr_t s) {
  if (s == nullptr) {
    req->complete();
  } else if (UCS_PTR_IS_ERR(s)) {
    req->fail(kindOf(UCS_PTR_STATUS(s)), ucs_status_string(UCS_PTR_STATUS(s)));
  } else {
    req->transportData = s;
  }
}

void onRecv(void* ucxRequest, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* req = static_cast<Request*>(user);
  req->transportData = nullptr;
  ucp_request_free(ucxRequest);
  finishRecv(req, status, info);
}

}  // namespace

UcxTransport::UcxTransport() {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  // UCX's TCP timers are left at their defaults: a peer that stops answering (a lost host, a cut
  // link, a stopped process) is found by ddl's heartbeats (runtime/heartbeat.h), on every
  // transport, within TORCH_DDL_HEARTBEAT_TIMEOUT_MS.
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // RMA: memory mapped for peers on the host (shared windows, see transport.h).
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  params.name = "torch_ddl";
  ucs_status_t status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(status, "ucp_init");

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Created here, then driven by the progress thread alone: one thread at a time.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  check(ucp_worker_create(context_, &wparams, &worker_), "ucp_worker_create");

  ucp_address_t* address = nullptr;
  size_t length = 0;
  check(ucp_worker_get_address(worker_, &address, &length), "ucp_worker_get_address");
  std::string key = hostKey();
  uint16_t keyLength = static_cast<uint16_t>(key.size());
  address_.assign(reinterpret_cast<const char*>(&keyLength), sizeof(keyLength));
  address_ += key;
  address_.append(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  check(ucp_worker_get_efd(worker_, &wakeFd_), "ucp_worker_get_efd");
}

UcxTransport::~UcxTransport() {
  // Messages nobody will receive (an op failed before it posted its receives) are taken in and
  // dropped, so that UCX does not report them at exit as unexpected descriptors.
  discard(0, 0);
  auto drained = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (discarding_ > 0 && std::chrono::steady_clock::now() < drained) {
    ucp_worker_progress(worker_);
  }
  while (!windows_.empty()) releaseWindow(windows_.begin()->first);
  while (!regions_.empty()) closeRegion(regions_.begin()->first);
  drained = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (keysFlushing_ > 0 && std::chrono::steady_clock::now() < drained) {
    ucp_worker_progress(worker_);
  }
  std::vector<ucs_status_ptr_t> closing;
  for (Endpoint* e : endpoints_) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t s = ucp_ep_close_nbx(e->ep, &p);
    if (s != nullptr && !UCS_PTR_IS_ERR(s)) closing.push_back(s);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (ucs_status_ptr_t s : closing) {
    while (ucp_request_check_status(s) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker_);
    }
    if (ucp_request_check_status(s) != UCS_INPROGRESS) ucp_request_free(s);
  }
  for (Endpoint* e : endpoints_) delete e;
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::string UcxTransport::hostKey() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char ns[128] = {};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return std::string(host) + "/" + (n > 0 ? std::string(ns, n) : std::string("?"));
}

void UcxTransport::onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<Endpoint*>(arg);
  if (e->failure != UCS_OK) return;
  e->failure = status;
  e->transport->lost_.emplace_back(
      e->id, std::string("its connection failed (UCX: ") + ucs_status_string(status) + ")");
}

std::vector<std::pair<PeerId, std::string>> UcxTransport::lostPeers() {
  std::vector<std::pair<PeerId, std::string>> out;
  out.swap(lost_);
  return out;
}

PeerId UcxTransport::connect(const std::string& address) {
  auto it = ids_.find(address);
  if (it != ids_.end()) return it->second;
  uint16_t keyLength = 0;
  if (address.size() < sizeof(keyLength)) throw Error("ddl: malformed UCX peer address");
  std::memcpy(&keyLength, address.data(), sizeof(keyLength));
  if (address.size() < sizeof(keyLength) + keyLength) {
    throw Error("ddl: malformed UCX peer address");
  }
  bool sameHost = address.compare(sizeof(keyLength), keyLength, hostKey()) == 0;
  auto* e = new Endpoint();
  e->transport = this;
  e->id = static_cast<PeerId>(endpoints_.size());
  e->address = address;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address =
      reinterpret_cast<const ucp_address_t*>(address.data() + sizeof(keyLength) + keyLength);
  params.err_mode = sameHost ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onEndpointError;
  params.err_handler.arg = e;
  ucs_status_t status = ucp_ep_create(worker_, &params, &e->ep);
  if (status != UCS_OK) {
    delete e;
    check(status, "ucp_ep_create");
  }
  PeerId id = static_cast<PeerId>(endpoints_.size());
  endpoints_.push_back(e);
  ids_.emplace(address, id);
  return id;
}

void UcxTransport::send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) {
  if (unreachable(peer, req)) return;
  ucp_request_param_t p = sendParams(req);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  sendStarted(req, ucp_tag_send_nbx(endpoints_[peer]->ep, data, bytes, tag, &p));
}

namespace {

ucp_request_param_t recvParams(Request* req) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.recv = &onRecv;
  p.user_data = req;
  p.datatype = ucp_dt_make_contig(1);
  return p;
}

// A receive just started: done already (`info` says what arrived), failed, or in flight.
void receiveStarted(Request* req, ucs_status_ptr_t s, const ucp_tag_recv_info_t& info,
                    size_t bytes) {
  if (s == nullptr) {
    finishRecv(req, info.length > bytes ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK, &info);
  } else if (UCS_PTR_IS_ERR(s)) {
    finishRecv(req, UCS_PTR_STATUS(s), nullptr);
  } else {
    req->transportData = s;
  }
}

}  // namespace

void UcxTransport::recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) {
  ucp_tag_recv_info_t info{};
  ucp_request_param_t p = recvParams(req);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
  p.recv_info.tag_info = &info;
  receiveStarted(req, ucp_tag_recv_nbx(worker_, data, bytes, tag, mask, &p), info, bytes);
}

bool UcxTransport::receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                                  Request* req) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h message = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
  if (message == nullptr) return false;
  ucp_request_param_t p = recvParams(req);
  receiveStarted(req, ucp_tag_msg_recv_nbx(worker_, data, bytes, message, &p), info, bytes);
  return true;
}

void UcxTransport::discard(uint64_t tag, uint64_t mask) {
  ucp_tag_recv_info_t info{};
  while (ucp_tag_message_h message = ucp_tag_probe_nb(worker_, tag, mask, 1, &info)) {
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_USER_DATA;
    p.datatype = ucp_dt_make_contig(1);
    p.user_data = this;
    // Longer messages are truncated: UCX still completes them, and their senders.
    p.cb.recv = [](void* request, ucs_status_t, const ucp_tag_recv_info_t*, void* self) {
      --static_cast<UcxTransport*>(self)->discarding_;
      ucp_request_free(request);
    };
    ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(
        worker_, discardBuffer_.data(), std::min(info.length, discardBuffer_.size()), message, &p);
    if (s != nullptr && !UCS_PTR_IS_ERR(s)) ++discarding_;
  }
}

void UcxTransport::cancel(Request* req) {
  if (req->transportData != nullptr) ucp_request_cancel(worker_, req->transportData);
}

// A key for peers: the memory's base address and length, then UCX's packed remote key.
std::string UcxTransport::packedKey(const void* base, size_t bytes, const void* packed,
                                    size_t packedLength) {
  uint64_t header[2] = {reinterpret_cast<uint64_t>(base), bytes};
  std::string key(reinterpret_cast<const char*>(header), sizeof(header));
  return key.append(static_cast<const char*>(packed), packedLength);
}

bool UcxTransport::unpackKey(PeerId peer, const std::string& key, uint64_t header[2],
                             ucp_rkey_h* rkey) {
  if (key.size() <= 2 * sizeof(uint64_t) || peer < 0 ||
      peer >= static_cast<PeerId>(endpoints_.size())) {
    return false;
  }
  std::memcpy(header, key.data(), 2 * sizeof(uint64_t));
  return ucp_ep_rkey_unpack(endpoints_[peer]->ep, key.data() + 2 * sizeof(uint64_t), rkey) ==
         UCS_OK;
}

// A window is UCX-allocated memory (shared memory where UCX has a shared-memory transport); its
// key is the base address, the length and the packed remote key. A peer maps it with
// ucp_rkey_ptr, which succeeds only when the memory can be addressed from the peer's process.
uint64_t UcxTransport::allocateWindow(size_t bytes, void** base, std::string* key) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = bytes;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  Window w;
  if (ucp_mem_map(context_, &params, &w.memory) != UCS_OK) return 0;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  void* packed = nullptr;
  size_t packedLength = 0;
  if (ucp_mem_query(w.memory, &attr) != UCS_OK || attr.length < bytes ||
      ucp_rkey_pack(context_, w.memory, &packed, &packedLength) != UCS_OK) {
    ucp_mem_unmap(context_, w.memory);
    return 0;
  }
  *key = packedKey(attr.address, bytes, packed, packedLength);
  ucp_rkey_buffer_release(packed);
  *base = attr.address;
  uint64_t id = nextWindow_++;
  windows_.emplace(id, w);
  return id;
}

uint64_t UcxTransport::mapWindow(PeerId peer, const std::string& key, void** base, size_t* bytes) {
  uint64_t header[2];
  Window w;
  if (!unpackKey(peer, key, header, &w.rkey)) return 0;
  void* local = nullptr;
  if (ucp_rkey_ptr(w.rkey, header[0], &local) != UCS_OK || local == nullptr) {
    ucp_rkey_destroy(w.rkey);
    return 0;
  }
  *base = local;
  *bytes = header[1];
  uint64_t id = nextWindow_++;
  windows_.emplace(id, w);
  return id;
}

void UcxTransport::releaseWindow(uint64_t id) {
  auto it = windows_.find(id);
  if (it == windows_.end()) return;
  if (it->second.rkey != nullptr) ucp_rkey_destroy(it->second.rkey);
  if (it->second.memory != nullptr) ucp_mem_unmap(context_, it->second.memory);
  windows_.erase(it);
}

// A region's key is its base address and length, then the packed remote key. Peers put through
// UCX (shared memory or CMA on a host, TCP or RDMA across hosts); the registration keeps the pages
// pinned where the network needs it.
uint64_t UcxTransport::registerRegion(void* base, size_t bytes, std::string* key) {
  if (bytes == 0) return 0;
  ucp_mem_map_params_t params{};
  // Non-blocking: the pages are not pinned here and now (this runs on the turning thread, and
  // pinning a large tensor would stop heartbeats), but as the network first needs them.
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = base;
  params.length = bytes;
  params.flags = UCP_MEM_MAP_NONBLOCK;
  Region r;
  if (ucp_mem_map(context_, &params, &r.memory) != UCS_OK) return 0;
  void* packed = nullptr;
  size_t packedLength = 0;
  if (ucp_rkey_pack(context_, r.memory, &packed, &packedLength) != UCS_OK) {
    ucp_mem_unmap(context_, r.memory);
    return 0;
  }
  *key = packedKey(base, bytes, packed, packedLength);
  ucp_rkey_buffer_release(packed);
  r.bytes = bytes;
  uint64_t id = nextRegion_++;
  regions_.emplace(id, r);
  return id;
}

uint64_t UcxTransport::openRegion(PeerId peer, const std::string& key) {
  uint64_t header[2];
  Region r;
  if (!unpackKey(peer, key, header, &r.rkey)) return 0;
  r.remoteBase = header[0];
  r.bytes = header[1];
  r.peer = peer;
  uint64_t id = nextRegion_++;
  regions_.emplace(id, r);
  return id;
}

bool UcxTransport::unreachable(PeerId peer, Request* req) {
  if (peer < 0 || peer >= static_cast<PeerId>(endpoints_.size())) {
    req->fail(StatusKind::kOther, "no endpoint " + std::to_string(peer));
    return true;
  }
  if (endpoints_[peer]->failure != UCS_OK) {
    req->fail(StatusKind::kPeerLost,
              std::string("peer unreachable: ") + ucs_status_string(endpoints_[peer]->failure));
    return true;
  }
  return false;
}

void UcxTransport::put(PeerId peer, uint64_t remote, size_t offset, const void* data, size_t bytes,
                       Request* req) {
  if (unreachable(peer, req)) return;
  auto it = regions_.find(remote);
  if (it == regions_.end() || it->second.rkey == nullptr || it->second.peer != peer ||
      offset > it->second.bytes || bytes > it->second.bytes - offset) {
    req->fail(StatusKind::kInvalidArgument, "the put falls outside the peer's region");
    return;
  }
  if (bytes == 0) {
    req->complete();
    return;
  }
  ucp_request_param_t p = sendParams(req);
  sendStarted(req, ucp_put_nbx(endpoints_[peer]->ep, data, bytes, it->second.remoteBase + offset,
                               it->second.rkey, &p));
}

void UcxTransport::flush(PeerId peer, Request* req) {
  if (unreachable(peer, req)) return;
  ucp_request_param_t p = sendParams(req);
  sendStarted(req, ucp_ep_flush_nbx(endpoints_[peer]->ep, &p));
}

namespace {
struct FlushingKey {
  size_t* flushing;
  ucp_rkey_h key;
};
}  // namespace

void UcxTransport::keyFlushed(void* ucxRequest, ucs_status_t /*status*/, void* user) {
  auto* k = static_cast<FlushingKey*>(user);
  ucp_rkey_destroy(k->key);
  --*k->flushing;
  delete k;
  ucp_request_free(ucxRequest);
}

void UcxTransport::closeRegion(uint64_t id) {
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  const Region r = it->second;
  regions_.erase(it);  // no put goes through it from now on
  if (r.memory != nullptr) ucp_mem_unmap(context_, r.memory);
  if (r.rkey == nullptr) return;
  // Puts posted through the key may still be in flight (a window dropped without
  // tensor_deregister flushing them): UCX may still read the key, which is destroyed only once a
  // flush of the peer, posted after them, has completed.
  if (r.peer >= 0 && r.peer < static_cast<PeerId>(endpoints_.size()) &&
      endpoints_[r.peer]->failure == UCS_OK) {
    auto* k = new FlushingKey{&keysFlushing_, r.rkey};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxTransport::keyFlushed;
    p.user_data = k;
    ucs_status_ptr_t s = ucp_ep_flush_nbx(endpoints_[r.peer]->ep, &p);
    if (s != nullptr && !UCS_PTR_IS_ERR(s)) {
      ++keysFlushing_;
      return;
    }
    delete k;
  }
  ucp_rkey_destroy(r.rkey);
}

bool UcxTransport::progress() { return ucp_worker_progress(worker_) != 0; }

bool UcxTransport::arm() { return ucp_worker_arm(worker_) == UCS_OK; }

std::string UcxTransport::name() const { return "ucx " + version(); }

std::string UcxTransport::version() { return ucp_get_version_string(); }

std::vector<std::string> UcxTransport::devices() const {
  std::set<std::string> found;
  uct_component_h* components = nullptr;
  unsigned numComponents = 0;
  if (uct_query_components(&components, &numComponents) != UCS_OK) return {};
  for (unsigned c = 0; c < numComponents; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& mdDesc : mds) {
      uct_md_config_t* mdConfig = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &mdConfig) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t st = uct_md_open(components[c], mdDesc.md_name, mdConfig, &md);
      uct_config_release(mdConfig);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned numTls = 0;
      if (uct_md_query_tl_resources(md, &tls, &numTls) == UCS_OK) {
        for (unsigned t = 0; t < numTls; ++t) {
          found.insert(std::string(tls[t].tl_name) + "/" + tls[t].dev_name);
        }
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return {found.begin(), found.end()};
}

}  // namespace ddl
