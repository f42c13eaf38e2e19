#include "window.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "../base/tag.h"

namespace ddl {
namespace {

constexpr uint32_t kAdopted = WindowOffer::kAdopted;
constexpr uint32_t kHeldAlready = WindowOffer::kHeldAlready;
constexpr uint32_t kRefused = WindowOffer::kRefused;
WindowOffer decode(const char* data, size_t bytes, int from) {
  WindowOffer o;
  if (!decodeWindowOffer(data, bytes, &o)) {
    throw Error("ddl: a malformed window offer from rank " + std::to_string(from));
  }
  return o;
}

// A step of deregistration: what `start` returns, or a work failed with what it threw.
std::shared_ptr<Work> startStep(const std::function<std::shared_ptr<Work>()>& start) {
  try {
    return start();
  } catch (const Error& e) {
    auto failed = std::make_shared<Work>("tensor_deregister");
    failed->finish(e.status());
    return failed;
  }
}

Task putTask(Op& op, int peer, uint64_t remote, size_t offset, const void* data, size_t bytes) {
  co_await op.all(op.put(peer, remote, offset, data, bytes));
}

Task flushTask(Op& op, std::vector<int> peers) {
  std::vector<Request*> flushes;
  for (int p : peers) flushes.push_back(op.flush(p));
  co_await op.all(std::move(flushes));
}

// Options for one of the window's own collectives: checked as `as`, not as what it runs.
CallOptions windowCall(Collective as, uint64_t count = 0) {
  CallOptions options;
  options.as = as;
  options.asCount = count;
  return options;
}

// Why the ranks' offers to register cannot be taken together ("" where they can): a rank refused,
// a rank's window already holds a tensor, or their layouts differ.
std::string disagreement(const std::vector<WindowOffer>& offers) {
  std::string differ, holding, refusals;
  int listed = 0;
  for (size_t r = 0; r < offers.size(); ++r) {
    const uint32_t flags = offers[r].header.flags;
    if (flags & kHeldAlready) holding += (holding.empty() ? "" : ", ") + std::to_string(r);
    if (flags & kRefused) refusals += "; rank " + std::to_string(r) + ": " + offers[r].layout;
    if (offers[r].layout != offers[0].layout && listed++ < 8) {
      differ += ", rank " + std::to_string(r) + " " + offers[r].layout;
    }
  }
  if (!refusals.empty()) return "refused" + refusals;
  if (!holding.empty()) {
    return "the window already holds a tensor on rank " + holding +
           " (tensor_deregister it first, on every rank)";
  }
  if (!differ.empty()) {
    return "every rank must register a tensor of the same dtype and shape: rank 0 " +
           offers[0].layout + differ;
  }
  return "";
}

}  // namespace

std::string encodeWindowOffer(const WindowOffer& o) {
  std::string out(reinterpret_cast<const char*>(&o.header), sizeof(o.header));
  return out + o.layout + o.share + o.region;
}

bool decodeWindowOffer(const char* data, size_t bytes, WindowOffer* o) {
  if (bytes < sizeof(o->header)) return false;
  std::memcpy(&o->header, data, sizeof(o->header));
  const size_t rest = size_t{o->header.layoutBytes} + o->header.shareBytes + o->header.regionBytes;
  if (bytes != sizeof(o->header) + rest) return false;
  const char* p = data + sizeof(o->header);
  o->layout.assign(p, o->header.layoutBytes);
  o->share.assign(p + o->header.layoutBytes, o->header.shareBytes);
  o->region.assign(p + o->header.layoutBytes + o->header.shareBytes, o->header.regionBytes);
  return true;
}

// The puts posted to `peer` before this op have landed once the flush completes: the signal
// leaves after them.
Task Window::signalTask(Op& op, int peer, uint32_t sequence, uint64_t slot, Token token,
                        bool flush) {
  if (flush) co_await op.all(op.flush(peer));
  co_await op.all(op.sendUnder(sequence, peer, slot, &token, sizeof(token)));
}

// Takes the next signal of this window from `peer`: one of another window under the same tag
// (a window destroyed before, on a group that held the id) is dropped.
Task Window::waitSignalTask(Op& op, int peer, uint32_t sequence, uint64_t slot, Token expected) {
  op.describeTimeout = [&op, peer] {
    return "Timed out after " + std::to_string(op.timeout().count()) +
           " ms waiting for a signal from rank " + std::to_string(peer);
  };
  while (true) {
    Token token;
    Request* r = op.recvUnder(sequence, peer, slot, &token, sizeof(token));
    co_await op.all(r);
    if (r->receivedBytes == sizeof(token) && token.window == expected.window) co_return;
  }
}

Window::Window(std::shared_ptr<Communicator> comm, uint64_t number)
    : comm_(std::move(comm)),
      number_(number),
      id_(number << tag::kGroupBits | comm_->id()),
      signalSequence_(static_cast<uint32_t>(number)),
      signalSlot_(tag::slot(tag::kWindowPhase, comm_->id())) {
  static_assert(tag::kGroupBits <= tag::kStepBits, "a group's id fits a step");
  const Group& of = *comm_->group_;
  group_ = std::make_shared<Group>();
  group_->runtime = of.runtime;
  group_->rank = of.rank;
  group_->size = of.size;
  group_->id = tag::kAgreementGroup;
  group_->directory = of.directory;
  group_->printRing = of.printRing;
  group_->name = of.name + "'s window " + std::to_string(number);
  group_->buffers = of.buffers;
  group_->state = of.state;  // closing or failing the group ends its windows' ops too
}

Window::Creating Window::startCreate(Communicator& comm) {
  // The number is taken here first (a window made at once on another group of this process
  // takes a higher one), then agreed: the highest of the ranks'.
  Creating creating;
  creating.comm = &comm;
  creating.number =
      std::make_shared<int64_t>(static_cast<int64_t>(comm.engine().takeWindowNumber()));
  creating.work = comm.allreduce(creating.number.get(), 1, DataType::kInt64, ReduceOp::kMax,
                                 windowCall(Collective::kWindowCreate));
  return creating;
}

std::shared_ptr<Window> Window::finishCreate(const Creating& creating) {
  if (creating.work->failed()) throw Error(creating.work->status());
  const auto number = static_cast<uint64_t>(*creating.number);
  creating.comm->engine().tookWindowId(number);
  return std::shared_ptr<Window>(new Window(creating.comm->shared_from_this(), number));
}

std::shared_ptr<Window> Window::create(Communicator& comm) {
  const Creating creating = startCreate(comm);
  creating.work->wait();
  return finishCreate(creating);
}

Window::~Window() {
  std::vector<Peer> peers;
  peers.swap(peers_);
  const uint64_t region = region_;
  // Signals that no wait took are dropped with the window (a later window's tag may be the same).
  const uint64_t signals = tag::make(tag::kAgreementGroup, signalSequence_, signalSlot_, 0);
  const uint64_t anySource = tag::anySource(tag::wideBits(group_->size));
  Runtime::postIfAlive(group_->runtime, [runtime = group_->runtime, peers = std::move(peers),
                                         region, signals, anySource]() mutable {
    releaseOn(*runtime, std::move(peers), region);
    runtime->transport().discard(signals, anySource);
  });
}

std::string Window::where(const char* name) const {
  return std::string("ddl: ") + name + " on " + group_->name + " (rank " + std::to_string(rank()) +
         " of " + std::to_string(size()) + ")";
}

void Window::checkPeer(const char* name, int peer) const {
  if (peer < 0 || peer >= size()) {
    throw Error(where(name) + ": rank " + std::to_string(peer) + " is not a rank of it",
                StatusKind::kInvalidArgument);
  }
}

bool Window::attached() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return attached_;
}

void Window::attach(const WindowMemory& given) {
  std::unique_ptr<Attaching> attaching = startAttach(given);
  attaching->work->wait();
  finishAttach(*attaching);
}

std::unique_ptr<Window::Attaching> Window::startAttach(const WindowMemory& given) {
  Engine& engine = comm_->engine();
  const bool held = attached();
  const Level& hosts = comm_->topology().levels[0];
  bool hostPeers = false;
  for (int r = 0; r < size(); ++r)
    hostPeers |= r != rank() && hosts.blockOf(r) == hosts.blockOf(rank());

  WindowOffer mine;
  mine.header.bytes = given.bytes;
  const bool refused = !given.refusal.empty();
  mine.layout = refused ? given.refusal : given.layout;
  mine.header.flags = (held ? kHeldAlready : 0) | (refused ? kRefused : 0);
  auto attaching = std::make_unique<Attaching>();
  attaching->given = given;
  if (!held && !refused && given.bytes > 0) {
    // Peers on this host map the memory where it is shared, or can be moved into shared memory.
    SharedBuffers::Found found;
    if (given.memory == MemoryKind::kHost && hostPeers && group_->buffers) {
      SharedBuffers& buffers = *group_->buffers;
      bool shared = buffers.find(given.data, given.bytes, &found);
      if (!shared && given.adoptable.base != nullptr && engine.config().shareTensors &&
          buffers.adopt(given.adoptable.base, given.adoptable.bytes)) {
        shared = buffers.find(given.data, given.bytes, &found);
      }
      if (shared) {
        mine.share = found.key;
        mine.header.offset = found.offset;
        mine.header.flags |= found.adopted ? kAdopted : 0;
      }
    }
    engine.call([&] {
      attaching->region =
          group_->runtime->transport().registerRegion(given.data, given.bytes, &mine.region);
    });
  }
  mine.header.layoutBytes = static_cast<uint32_t>(mine.layout.size());
  mine.header.shareBytes = static_cast<uint32_t>(mine.share.size());
  mine.header.regionBytes = static_cast<uint32_t>(mine.region.size());
  attaching->offer = encodeWindowOffer(mine);
  attaching->blocks = std::make_shared<VaryingBlocks>();
  try {
    attaching->work =
        comm_->allgatherVarying(attaching->offer.data(), attaching->offer.size(), attaching->blocks,
                                windowCall(Collective::kWindowRegister));
  } catch (...) {
    unregister(attaching->region);
    throw;
  }
  return attaching;
}

void Window::unregister(uint64_t region) {
  if (region == 0) return;
  comm_->engine().call([&] { group_->runtime->transport().closeRegion(region); });
}

void Window::finishAttach(Attaching& attaching) {
  const char* name = "tensor_register";
  const WindowMemory& given = attaching.given;
  const uint64_t region = attaching.region;
  const Level& hosts = comm_->topology().levels[0];
  std::vector<WindowOffer> offers;
  try {
    if (attaching.work->failed()) throw Error(attaching.work->status());
    const VaryingBlocks& blocks = *attaching.blocks;
    for (int r = 0; r < size(); ++r) {
      offers.push_back(decode(blocks.data.data() + blocks.offsets[r],
                              blocks.offsets[r + 1] - blocks.offsets[r], r));
    }
  } catch (...) {
    unregister(region);
    throw;
  }
  // Every rank has the same offers, so every rank refuses alike.
  const std::string refused = disagreement(offers);
  if (!refused.empty()) {
    unregister(region);
    throw Error(where(name) + ": " + refused, StatusKind::kInvalidArgument);
  }
  std::vector<Peer> peers(static_cast<size_t>(size()));
  comm_->engine().call([&] {
    Transport& transport = group_->runtime->transport();
    for (int j = 0; j < size(); ++j) {
      const WindowOffer& o = offers[j];
      Peer& p = peers[j];
      p.bytes = o.header.bytes;
      if (j == rank() || p.bytes == 0) continue;
      if (hosts.blockOf(j) != hosts.blockOf(rank())) {
        p.unmapped = "it is on another host";
      } else if (o.share.empty()) {
        p.unmapped =
            "its memory is not shared (register a tensor made by torch_ddl.empty_shared, "
            "or one that is its whole storage, on the host's ranks)";
      } else {
        auto mapping = std::make_shared<Mapping>();
        mapping->runtime = group_->runtime;
        char* base = nullptr;
        std::string why = "the transport cannot map it here";
        if (o.header.flags & kAdopted) {
          mapping->adoptedBase = SharedBuffers::mapAdopted(o.share, &mapping->length, &why);
          base = mapping->adoptedBase;
        } else {
          void* at = nullptr;
          mapping->window = transport.mapWindow(group_->peer(j), o.share, &at, &mapping->length);
          if (mapping->window != 0) base = static_cast<char*>(at);
        }
        // What the offer says must lie in what the peer shares: a put writes up to its end.
        const size_t length = mapping->length;
        if (base != nullptr && (o.header.offset > length || p.bytes > length - o.header.offset)) {
          base = nullptr;
          why = "its offer of " + std::to_string(p.bytes) + " bytes at byte " +
                std::to_string(o.header.offset) + " passes the end of the " +
                std::to_string(length) + " bytes it shares";
        }
        if (base != nullptr) {
          p.mapped = base + o.header.offset;
          p.mapping = std::move(mapping);
        } else {
          p.unmapped = "its shared memory cannot be mapped here: " + why;
        }
      }
      if (p.mapped == nullptr && !o.region.empty()) {
        p.remote = transport.openRegion(group_->peer(j), o.region);
      }
    }
  });
  std::unique_lock<std::shared_mutex> lock(mutex_);
  mine_ = given;
  region_ = region;
  peers_ = std::move(peers);
  attached_ = true;
  detaching_ = false;
}

Window::Mapping::~Mapping() {
  if (adoptedBase != nullptr) SharedBuffers::unmapAdopted(adoptedBase, length);
  if (window == 0) return;
  // The runtime released every window if it is gone.
  Runtime::postIfAlive(
      runtime, [runtime = runtime, id = window] { runtime->transport().releaseWindow(id); });
}

void Window::releaseOn(Runtime& runtime, std::vector<Peer> peers, uint64_t region) {
  Transport& transport = runtime.transport();
  for (Peer& p : peers) {
    if (p.remote != 0) transport.closeRegion(p.remote);
  }
  if (region != 0) transport.closeRegion(region);
}

void Window::release() {
  std::vector<Peer> peers;
  uint64_t region = 0;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);  // after every put's copy
    peers.swap(peers_);
    region = region_;
    region_ = 0;
    mine_ = WindowMemory{};
    attached_ = false;
    detaching_ = false;
  }
  Runtime& runtime = *group_->runtime;
  comm_->engine().call([&] { releaseOn(runtime, std::move(peers), region); });
}

void Window::detach() {
  std::unique_ptr<Detaching> detaching = startDetach();
  do {
    detaching->work->wait();
  } while (!stepDetach(*detaching));
}

// This rank's puts land; then every rank tells it has done the same, so that no rank puts into
// memory let go after the barrier. The barrier is made also when the flush failed (the others
// wait for it); the memory is let go only when both succeeded.
std::unique_ptr<Window::Detaching> Window::startDetach() {
  auto detaching = std::make_unique<Detaching>();
  {
    // Puts are refused from now on: the ones posted before are flushed first.
    std::unique_lock<std::shared_mutex> lock(mutex_);
    detaching_ = attached_;
    for (int j = 0; j < static_cast<int>(peers_.size()); ++j) {
      if (peers_[j].remote != 0) detaching->remote.push_back(j);
    }
  }
  if (detaching->remote.empty()) {
    startBarrier(*detaching);
  } else {
    detaching->work = startStep([&] {
      CallOptions options;
      return comm_->startOn(
          group_, signalSequence_, nullptr, "flush", options,
          [remote = detaching->remote](Op& op) { return flushTask(op, remote); }, -1);
    });
  }
  return detaching;
}

void Window::startBarrier(Detaching& detaching) {
  detaching.barrier = true;
  detaching.work =
      startStep([&] { return comm_->barrier(windowCall(Collective::kWindowDeregister)); });
}

std::shared_ptr<Work> Window::pending(const Detaching& detaching) { return detaching.work; }

bool Window::stepDetach(Detaching& detaching) {
  if (detaching.work->failed() && detaching.failure.ok())
    detaching.failure = detaching.work->status();
  if (!detaching.barrier) {
    startBarrier(detaching);
    return false;
  }
  detaching.work.reset();
  if (!detaching.failure.ok()) {
    {
      std::unique_lock<std::shared_mutex> lock(mutex_);
      detaching_ = false;
    }
    const Status& failure = detaching.failure;
    throw Error(Status(failure.kind,
                       where("tensor_deregister") + ": " + failure.detail +
                           " (the tensor stays registered: peers may still put into it)",
                       failure.ranks));
  }
  release();
  return true;
}

size_t Window::bytesOf(int peer) const {
  checkPeer("bytes", peer);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!attached_) return 0;
  return peer == rank() ? mine_.bytes : peers_[peer].bytes;
}

std::shared_ptr<char> Window::mapped(int peer, std::string* why) const {
  checkPeer("map_remote_tensor", peer);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!attached_) {
    *why = "the window holds no tensor (tensor_register one first)";
    return nullptr;
  }
  if (peer == rank())
    return std::shared_ptr<char>(std::shared_ptr<char>(), static_cast<char*>(mine_.data));
  const Peer& p = peers_[peer];
  if (p.mapped == nullptr) {
    *why = p.unmapped;
    return nullptr;
  }
  return std::shared_ptr<char>(p.mapping, p.mapped);
}

std::string Window::route(int peer) const {
  checkPeer("route", peer);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (peer == rank()) return "self";
  if (!attached_) return "none";
  return peers_[peer].mapped != nullptr ? "mapped" : peers_[peer].remote != 0 ? "put" : "none";
}

std::shared_ptr<Work> Window::put(const void* data, size_t bytes, int peer, size_t offset,
                                  CallOptions options) {
  const char* name = "put";
  checkPeer(name, peer);
  // Held until a copy into mapped memory is made: the memory is let go under the lock alone.
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!attached_ || detaching_) {
    throw Error(where(name) + (attached_ ? ": the window's tensor is being deregistered"
                                         : ": the window holds no tensor (tensor_register one "
                                           "first)"),
                StatusKind::kInvalidArgument);
  }
  const size_t room = peer == rank() ? mine_.bytes : peers_[peer].bytes;
  if (offset > room || bytes > room - offset) {
    throw Error(where(name) + ": " + std::to_string(bytes) + " bytes at byte " +
                    std::to_string(offset) + " do not fit in the " + std::to_string(room) +
                    " bytes rank " + std::to_string(peer) + " registered",
                StatusKind::kInvalidArgument);
  }
  char* target = nullptr;
  uint64_t remote = 0;
  if (peer == rank()) {
    target = static_cast<char*>(mine_.data) + offset;
  } else if (peers_[peer].mapped != nullptr) {
    target = peers_[peer].mapped + offset;
  } else {
    remote = peers_[peer].remote;
    if (remote == 0 && bytes > 0) {
      throw Error(where(name) + ": rank " + std::to_string(peer) +
                      "'s memory cannot be reached from here: " + peers_[peer].unmapped +
                      ", and the transport offers no puts to it",
                  StatusKind::kInvalidArgument);
    }
  }
  if (remote != 0) {
    lock.unlock();  // a put through the transport is posted as an op: detach flushes it
    return comm_->startOn(
        group_, signalSequence_, nullptr, name, options,
        [=](Op& op) { return putTask(op, peer, remote, offset, data, bytes); }, peer);
  }
  // Mapped (or this rank's own): one copy, here and now.
  std::shared_ptr<Work> work = options.work ? options.work : std::make_shared<Work>(name);
  work->markStarted();
  Status refused = group_->state->refusal();
  if (refused.ok()) {
    const std::vector<int> gone = group_->state->gone();
    if (std::find(gone.begin(), gone.end(), peer) != gone.end()) {
      refused = Status(StatusKind::kPeerLost,
                       where(name) + ": rank " + std::to_string(peer) + " is gone", {peer});
    }
  }
  if (!refused.ok()) {
    work->finish(refused);
    return work;
  }
  if (bytes > 0) memoryFor(options.memory, options.device).copy(target, data, bytes);
  std::atomic_thread_fence(std::memory_order_release);
  lock.unlock();
  work->succeed();
  return work;
}

std::shared_ptr<Work> Window::signal(int peer, CallOptions options) {
  const char* name = "signal";
  checkPeer(name, peer);
  if (peer == rank()) {
    throw Error(where(name) + ": a rank cannot signal itself", StatusKind::kInvalidArgument);
  }
  bool flush = false;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    flush = attached_ && peers_[peer].remote != 0;
  }
  const Token token{number_};
  return comm_->startOn(
      group_, signalSequence_, nullptr, name, options,
      [=, sequence = signalSequence_, slot = signalSlot_](Op& op) {
        return signalTask(op, peer, sequence, slot, token, flush);
      },
      peer);
}

std::shared_ptr<Work> Window::waitSignal(int peer, CallOptions options) {
  const char* name = "wait_signal";
  checkPeer(name, peer);
  if (peer == rank()) {
    throw Error(where(name) + ": a rank cannot wait for a signal from itself",
                StatusKind::kInvalidArgument);
  }
  const Token expected{number_};
  return comm_->startOn(
      group_, signalSequence_, nullptr, name, options,
      [=, sequence = signalSequence_, slot = signalSlot_](Op& op) {
        return waitSignalTask(op, peer, sequence, slot, expected);
      },
      peer);
}

}  // namespace ddl
