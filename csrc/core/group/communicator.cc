#include "communicator.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "../base/config.h"
#include "../base/log.h"
#include "../base/tag.h"
#include "../base/wire.h"
#include "../runtime/trace.h"
#include "../shm/shared_ring.h"
#include "derive.h"
#include "link_probe.h"

namespace ddl {
namespace {

PipelineSettings pipelineSettings(const Op& op) {
  const Config& c = config();
  const bool host = op.memory().kind() == MemoryKind::kHost;
  return PipelineSettings{host ? c.segmentBytes : c.deviceSegmentBytes, c.pipelineDepth,
                          static_cast<int>(std::max<size_t>(c.rings, 1)), c.directMinBytes};
}

// False when `times` blocks of `count` elements of `type` do not fit in size_t.
bool fits(size_t count, DataType type, size_t times = 1) {
  return count <=
         std::numeric_limits<size_t>::max() / elementSize(type) / std::max<size_t>(times, 1);
}

Task allreduceTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   Adoptable adoptable, std::shared_ptr<const AllreducePlan> plan) {
  const Config& c = config();
  PipelineSettings settings = pipelineSettings(op);
  // Device memory moves through the transport only (the shared-memory paths are for host
  // memory): a forced shm_ring or direct means the ring there.
  const bool host = op.memory().kind() == MemoryKind::kHost;
  switch (plan->algorithm) {
    case PlanAlgorithm::kTrivial:
      break;
    case PlanAlgorithm::kRecursiveDoubling:
      if (op.inlined()) {  // two ranks: the peer's data came with its call print
        const int peer = 1 - op.rank();
        co_await op.all(op.printFrom(peer));
        op.memory().reduce(type, reduce, data, op.inlinePayload(peer), count);
        break;
      }
      co_await allreduceRecursiveDoubling(op, data, count, type, reduce);
      break;
    case PlanAlgorithm::kLeaders:
      co_await allreduceLeaders(op, data, count, type, reduce, plan);
      break;
    case PlanAlgorithm::kRing:
      settings.rings = plan->rings;
      co_await allreduceRing(op, data, count, type, reduce, settings);
      break;
    case PlanAlgorithm::kMultiDim:
      co_await allreduceMultiDim(op, data, type, reduce, plan, settings);
      break;
    case PlanAlgorithm::kShared:
      if (!host) {
        co_await allreduceRing(op, data, count, type, reduce, settings);
        break;
      }
      SharedAllreduce mode =
          c.allreduceAlgorithm == AllreduceAlgorithm::kSharedRing ? SharedAllreduce::kSharedRing
          : c.allreduceAlgorithm == AllreduceAlgorithm::kDirect   ? SharedAllreduce::kDirect
                                                                  : SharedAllreduce::kAuto;
      if (!c.shareTensors || mode == SharedAllreduce::kSharedRing) adoptable = {};
      co_await allreduceShared(op, data, count, type, reduce, settings, mode, adoptable);
      break;
  }
  if (reduce == ReduceOp::kAvg) {
    op.memory().average(type, data, count, static_cast<size_t>(op.size()));
  }
}

// Operation bodies are plain coroutine functions (never capturing lambdas): a coroutine's
// parameters live in its frame, a lambda's captures would die with the closure.
Task reduceScatterTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::shared_ptr<const std::vector<BlockStage>> stages) {
  if (!stages->empty()) {
    co_await reduceScatterGrid(op, data, count, type, reduce, stages, pipelineSettings(op));
  } else {
    co_await reduceScatterRing(op, data, count, type, reduce, pipelineSettings(op));
  }
  if (reduce == ReduceOp::kAvg) {
    char* mine = static_cast<char*>(data) + op.rank() * count * elementSize(type);
    op.memory().average(type, mine, count, static_cast<size_t>(op.size()));
  }
}

Task reduceTask(Op& op, const void* in, void* out, size_t count, DataType type, ReduceOp reduce,
                int root) {
  co_await reduceTree(op, in, out, count, type, reduce, root);
  if (reduce == ReduceOp::kAvg && op.rank() == root) {
    op.memory().average(type, out, count, static_cast<size_t>(op.size()));
  }
}

// A collective's body, then the call check: the op completes only once every print it sent and
// asked for is done (a print that differs fails it as soon as it arrives: Op::observe).
Task checkedCall(Op& op, Task body) {
  op.startCallCheck();
  co_await body;
  co_await op.until([&op] { return op.callCheckDone(); });
}

uint64_t pointToPointSlot(uint32_t userTag) {
  const uint32_t high = userTag >> tag::kSequenceBits;
  return tag::slot(tag::kPointToPointPhase + (high >> tag::kStepBits), high);
}

Task sendTask(Op& op, const void* data, size_t bytes, int peer, uint32_t userTag) {
  co_await op.all(op.send(peer, pointToPointSlot(userTag), data, bytes));
}

Task recvTask(Op& op, void* data, size_t bytes, int peer, uint32_t userTag) {
  uint64_t slot = pointToPointSlot(userTag);
  Request* r = peer >= 0 ? op.recvUpTo(peer, slot, data, bytes) : op.recvAny(slot, data, bytes);
  co_await op.all(r);
  op.work->setSource(static_cast<int>(tag::source(r->senderTag)));
}

Task batchTask(Op& op, std::vector<Communicator::Transfer> transfers) {
  std::vector<Request*> requests;
  requests.reserve(transfers.size());
  for (const Communicator::Transfer& t : transfers) {
    const uint64_t slot = pointToPointSlot(t.userTag);
    requests.push_back(t.isSend ? op.sendUnder(t.userTag, t.peer, slot, t.data, t.bytes)
                                : op.recvUnder(t.userTag, t.peer, slot, t.data, t.bytes));
  }
  co_await op.all(std::move(requests));
}

// A group's runtime and shared buffers (the engine's), its name, its entry in the flight recorder
// and its shared-memory ring, once its rank, size and id are set.
void nameGroup(Group& group, Engine& engine) {
  group.runtime = &engine.runtime();
  group.buffers = engine.sharedBuffers();
  group.name = "group " + std::to_string(group.id);
  engine.runtime().recorder().describeGroup(group.id, group.name, group.rank, group.size);
  group.sharedRing = std::make_shared<SharedRing>(group.runtime);
  group.sharedRing->releasedSeen = group.buffers->releasedSoFar();
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(Engine& engine, KeyValueStore& store, int rank,
                                                   int size, std::chrono::milliseconds timeout,
                                                   const Topology* simulated) {
  GroupOptions options;
  options.timeout = timeout;
  options.topology = simulated;
  std::unique_ptr<Pending> pending = begin(engine, store, rank, size, options);
  pending->work->wait();
  return finish(*pending);
}

Communicator::Pending::~Pending() {
  if (claimed) Engine::releaseGroupIdIfAlive(engine, group->id);
}

std::unique_ptr<Communicator::Pending> Communicator::begin(Engine& engine, KeyValueStore& store,
                                                           int rank, int size,
                                                           const GroupOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("ddl: rank " + std::to_string(rank) + " is outside a group of size " +
                std::to_string(size));
  }
  if (static_cast<uint32_t>(size) > tag::kMaxRanks) {
    throw Error("ddl: groups are limited to " + std::to_string(tag::kMaxRanks) + " ranks");
  }
  auto pending = std::make_unique<Pending>();
  pending->engine = &engine;
  pending->store = &store;
  pending->options = options;
  auto group = std::make_shared<Group>();
  pending->group = group;
  group->rank = rank;
  group->size = size;
  group->addresses.resize(size);
  group->peers.assign(size, -1);
  // The store may hold the keys of an earlier creation of a group with this prefix (a group
  // destroyed and created again; a FileStore reused): every rank counts itself in, and the
  // creation the count falls in names this one's keys, so nobody reads a stale value.
  const int64_t joined = store.add("ddl/joined", 1);
  pending->key = "ddl/" + std::to_string((joined - 1) / size) + "/";
  const std::string& key = pending->key;
  if (rank == 0) {
    group->id = static_cast<uint32_t>(store.nextGroupNumber() % tag::kGroupIds);
    store.set(key + "group_id", std::to_string(group->id));
  } else {
    group->id = static_cast<uint32_t>(std::stoul(store.get(key + "group_id")));
  }
  nameGroup(*group, engine);
  engine.runtime().recorder().noteRank(rank);
  RankCard card;
  card.rank = rank;
  card.address = engine.localAddress();
  card.identity = options.locality ? "" : ProcessIdentity::self().encode();
  card.locality = (options.locality ? *options.locality : Locality::self()).encode();
  card.idTaken = !engine.claimGroupId(group->id);
  pending->claimed = !card.idTaken;
  if (size > 1) {
    store.set(key + "address/" + std::to_string(rank), card.address);
  }
  const int parent = bootstrapParent(rank);
  if (parent >= 0) {
    group->addresses[parent] = store.get(key + "address/" + std::to_string(parent));
  }
  pending->directory = std::make_shared<GroupDirectory>();
  pending->work = std::make_shared<Work>("group creation");
  auto op = std::make_unique<Op>(group, 0, "group creation", options.timeout, pending->work);
  const std::string racks = options.racks ? *options.racks : config().topology;
  op->task = bootstrapGroup(*op, group, std::move(card), parseRackMap(racks), pending->directory);
  engine.submit(std::move(op));
  return pending;
}

std::shared_ptr<Communicator> Communicator::finish(Pending& pending) {
  if (!pending.work->done()) throw Error("ddl: the group's creation has not finished");
  if (pending.work->failed()) throw Error(pending.work->error());
  GroupDirectory& directory = *pending.directory;
  if (!directory.error.ok()) throw Error(directory.error);
  std::shared_ptr<Group> group = pending.group;
  Engine& engine = *pending.engine;
  const GroupOptions& options = pending.options;
  engine.openControl(group);
  // Peers on this host are watched: one that exits fails the group's ops at once (liveness.h).
  std::vector<ProcessIdentity> identities(group->size);
  for (int r = 0; r < group->size; ++r) {
    if (r != group->rank && !directory.identities[r].empty()) {
      identities[r] = ProcessIdentity::decode(directory.identities[r]);
    }
  }
  engine.watch(group, identities);
  Topology topology = options.topology != nullptr ? *options.topology : directory.topology;
  if (topology.size != group->size) {
    throw Error("ddl: the topology given is for another group size");
  }
  directory = GroupDirectory{};
  const std::string links = options.links ? *options.links : config().links;
  PlanRequest request = options.plan ? *options.plan : planRequest();
  LinkCosts costs = parseLinks(links);
  costs.segmentBytes = static_cast<double>(config().segmentBytes);
  auto comm = std::shared_ptr<Communicator>(new Communicator(
      engine, group, options.timeout,
      PlanBook::forMachine(std::move(topology), std::move(costs), request, config().hierarchical)));
  comm->ownsId_ = pending.claimed;
  comm->identities_ = std::move(identities);
  pending.claimed = false;
  // Measured on real hosts only: a simulated topology's ranks share one process.
  if (options.topology == nullptr && !options.locality) {
    LinkCosts probed = comm->links();
    probeLinks(*comm, comm->topology(), &probed);
    comm->book_ = PlanBook::forMachine(comm->topology(), std::move(probed), std::move(request),
                                       config().hierarchical);
  }
  comm->logCreation("created");
  return comm;
}

Communicator::Communicator(Engine& engine, std::shared_ptr<Group> group,
                           std::chrono::milliseconds timeout, std::shared_ptr<PlanBook> book)
    : engine_(&engine), group_(std::move(group)), timeout_(timeout), book_(std::move(book)) {}

Communicator::~Communicator() {
  Engine::closeControl(engine_, group_->control);
  if (ownsId_) Engine::releaseGroupIdIfAlive(engine_, group_->id);
}

void Communicator::reject(const char* name, const std::string& why) noexcept {
  const auto sequence = static_cast<uint32_t>(sequence_.fetch_add(1));
  try {
    Engine::refuseOp(
        engine_, group_, sequence,
        "rank " + std::to_string(rank()) + " refused its call to " + name + ": " + why);
  } catch (...) {  // out of memory: the others time out instead
  }
}

void Communicator::refuse(const char* name, const std::string& what) {
  reject(name, what);
  throw Error(where(name) + ": " + what);
}

PlanRequest Communicator::planRequest() {
  const Config& c = config();
  PlanRequest request;
  switch (c.allreduceAlgorithm) {
    case AllreduceAlgorithm::kAuto:
      request.algorithm = PlanRequest::Algorithm::kAuto;
      break;
    case AllreduceAlgorithm::kDirect:
    case AllreduceAlgorithm::kSharedRing:
      request.algorithm = PlanRequest::Algorithm::kShared;
      break;
    case AllreduceAlgorithm::kRing:
      request.algorithm = PlanRequest::Algorithm::kRing;
      break;
    case AllreduceAlgorithm::kRecursiveDoubling:
      request.algorithm = PlanRequest::Algorithm::kRecursiveDoubling;
      break;
    case AllreduceAlgorithm::kMultiDim:
      request.algorithm = PlanRequest::Algorithm::kMultiDim;
      break;
    case AllreduceAlgorithm::kLeaders:
      request.algorithm = PlanRequest::Algorithm::kLeaders;
      break;
  }
  request.colors = static_cast<int>(c.colors);
  request.rings = static_cast<int>(c.rings);
  request.ringRings = static_cast<int>(std::max<size_t>(c.rings, 1));
  request.order = c.levelOrder;
  request.waves = static_cast<int>(c.waves);
  request.smallBytes = c.smallBytes;
  request.hostSlots = c.hostSlots;
  return request;
}

std::shared_ptr<const AllreducePlan> Communicator::allreducePlan(size_t count, DataType type) {
  auto plan = book_->allreduce(count, elementSize(type));
  if (logs(LogLevel::kInfo)) {  // once per size class (power of two) of this group
    const size_t bytes = count * elementSize(type);
    const uint64_t bit = uint64_t{1} << std::bit_width(bytes) % 64;
    if ((loggedSizes_.fetch_or(bit) & bit) == 0) {
      logLine(LogLevel::kInfo, group_->name + " rank " + std::to_string(rank()) +
                                   ": allreduce of " + std::to_string(bytes) +
                                   " bytes: " + plan->describe());
    }
  }
  return plan;
}

void Communicator::logCreation(const char* how) const {
  if (!logs(LogLevel::kInfo)) return;
  logLine(LogLevel::kInfo, group_->name + " rank " + std::to_string(rank()) + " of " +
                               std::to_string(size()) + " " + how + ": " + topology().describe() +
                               "; links " + links().describe());
}

std::pair<int, int> Communicator::hostRings() {
  std::pair<int, int> counts{0, 0};
  engine_->call([&] {
    for (const auto& [key, windows] : group_->sharedRing->levelRings) {
      (windows.ready ? counts.first : counts.second)++;
    }
  });
  return counts;
}

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& excluded,
                                                   bool abortFirst) {
  const char* name = "shrink_group";
  std::vector<bool> out(static_cast<size_t>(size()), false);
  std::string listed;  // "1, 3"
  std::vector<int> sorted = excluded;
  std::sort(sorted.begin(), sorted.end());
  for (int r : sorted) {
    if (r < 0 || r >= size()) {
      throw Error(where(name) + ": rank " + std::to_string(r) +
                  " to exclude is not a rank of a "
                  "group of " +
                  std::to_string(size()));
    }
    if (out[r]) throw Error(where(name) + ": rank " + std::to_string(r) + " is excluded twice");
    if (r == rank()) {
      throw Error(where(name) +
                  ": this rank is among those to exclude; an excluded rank does "
                  "not call shrink_group");
    }
    out[r] = true;
    listed += (listed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (sorted.empty()) throw Error(where(name) + ": no rank to exclude");
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (!out[r]) members.push_back(r);
  }
  if (abortFirst) {
    close(group_->name + " is being shrunk (SHRINK_ABORT) to exclude rank" +
          (sorted.size() > 1 ? "s " : " ") + listed);
  }
  return derive(members, agree(members, "exclude " + listed, name, nextAgreement(name), sorted));
}

uint32_t Communicator::nextAgreement(const char* what) {
  // From what the ranks share: the parent, the call, how many times it was made of the parent
  // before. Not from the request itself: ranks asked different things must meet to find out.
  const std::string key =
      std::to_string(group_->id) + "/" + what + "/" + std::to_string(derivations_[what]++);
  return static_cast<uint32_t>(std::hash<std::string>{}(key)&0xffff);
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks) {
  const char* name = "split_group";
  std::vector<int> members = ranks;
  std::sort(members.begin(), members.end());
  std::string asked;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= size()) {
      throw Error(where(name) + ": rank " + std::to_string(members[i]) +
                  " is not a rank of a group of " + std::to_string(size()));
    }
    if (i > 0 && members[i] == members[i - 1]) {
      throw Error(where(name) + ": rank " + std::to_string(members[i]) + " is named twice");
    }
    asked += (asked.empty() ? "form a group of ranks " : ", ") + std::to_string(members[i]);
  }
  // Every rank of this group calls split (torch's contract, as for NCCL's): the ones left out
  // count it too, so that later agreements of the others and theirs keep one numbering.
  const uint32_t sequence = nextAgreement(name);
  if (!std::binary_search(members.begin(), members.end(), rank())) return nullptr;
  return derive(members, agree(members, asked, name, sequence));
}

uint32_t Communicator::agree(const std::vector<int>& members, const std::string& request,
                             const char* what, uint32_t sequence,
                             const std::vector<int>& excluded) {
  Engine& engine = *engine_;
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = rank();
  agreement->size = size();
  agreement->id = tag::kAgreementGroup;
  agreement->name = group_->name + "'s " + what;
  agreement->addresses = group_->addresses;
  agreement->peers.assign(static_cast<size_t>(size()), -1);
  DeriveCard card;
  card.rank =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  card.parentRank = rank();
  card.request = request;
  for (bool held : engine.heldGroupIds()) card.heldIds.push_back(held ? 1 : 0);
  // A member that is gone (one this rank did not know of, or a view that still has it) fails
  // the agreement within milliseconds, not at its timeout: the members on this host are watched,
  // and those whose endpoints the parent opened are known by them.
  std::vector<ProcessIdentity> identities(static_cast<size_t>(size()));
  for (int m : members) {
    if (static_cast<size_t>(m) < identities_.size()) identities[m] = identities_[m];
  }
  std::vector<PeerId> endpoints;  // the parent's, for the ranks left out
  engine.call([&] {
    for (int m : members) agreement->peers[m] = group_->peers[m];
    endpoints = group_->peers;
  });
  engine.watch(agreement, identities);
  // The ranks left out are told first, in the agreement's word of failure: one that is alive and
  // in an agreement of this call of its own (a view that differs, whoever leads it) ends it at
  // once naming this request, and its members tell theirs; a dead one, or one that keeps to the
  // contract and does not call, never reads it. This rank's card goes up only once its words
  // have left (a connection they needed is made), within kTellWait: two views can then both
  // form a group only where each one's members heard their answer, two messages deep, before
  // the other's word, one message, reached them.
  if (!excluded.empty()) {
    const auto works = tellRanks(*agreement, sequence, excluded,
                                 std::string("the ranks were asked for different groups: rank ") +
                                     std::to_string(rank()) + " was asked to " + request + " (" +
                                     what + "), which leaves this rank out",
                                 std::min(timeout_, std::chrono::milliseconds(10000)), endpoints);
    const auto until = std::chrono::steady_clock::now() + std::min(timeout_, kTellWait);
    for (const auto& work : works) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !work->wait(left)) break;  // a dead host's: not waited for longer
    }
  }
  const DeriveResult result =
      runAgreement(agreement, sequence, members, std::move(card), what, timeout_);
  if (!result.error.ok()) throw Error(result.error);
  return result.id;
}

std::shared_ptr<Communicator> Communicator::derive(const std::vector<int>& members, uint32_t id) {
  Engine& engine = *engine_;
  if (!engine.claimGroupId(id)) {
    throw Error("ddl: the id " + std::to_string(id) + " agreed for a group derived from " +
                group_->name + " was taken here meanwhile (another group's creation); try again");
  }
  auto group = std::make_shared<Group>();
  group->size = static_cast<int>(members.size());
  group->id = id;
  std::vector<ProcessIdentity> identities(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m == rank()) group->rank = static_cast<int>(i);
    group->addresses.push_back(group_->addresses[m]);
    if (static_cast<size_t>(m) < identities_.size()) identities[i] = identities_[m];
  }
  group->peers.assign(members.size(), -1);
  nameGroup(*group, engine);
  engine.openControl(group);
  engine.watch(group, identities);
  auto book = PlanBook::forMachine(restrictTopology(topology(), members), links(), book_->request(),
                                   book_->hierarchical());
  auto comm =
      std::shared_ptr<Communicator>(new Communicator(engine, group, timeout_, std::move(book)));
  comm->ownsId_ = true;
  comm->identities_ = std::move(identities);
  comm->logCreation(("derived from " + group_->name).c_str());
  return comm;
}

namespace {

constexpr char kHandlePrefix[] = "ddl1:";

std::string toHex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool fromHex(const std::string& text, size_t from, std::string* bytes) {
  if ((text.size() - from) % 2 != 0) return false;
  auto value = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  for (size_t i = from; i < text.size(); i += 2) {
    const int hi = value(text[i]), lo = value(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

// Handle `index` of a reconfigure's list, as the card creation would have had from it.
RankCard decodeHandle(const std::string& h, int index) {
  std::string bytes;
  const size_t prefix = sizeof(kHandlePrefix) - 1;
  if (h.compare(0, prefix, kHandlePrefix) != 0 || !fromHex(h, prefix, &bytes)) {
    throw Error("ddl: reconfigure: handle " + std::to_string(index) +
                " is not a ddl reconfigure handle (get_reconfigure_handle() of a ddl group)");
  }
  Reader reader(bytes);
  RankCard card;
  card.rank = index;
  card.address = reader.text();
  card.identity = reader.text();
  card.locality = reader.text();
  if (!reader.ok(true)) {
    throw Error("ddl: reconfigure: handle " + std::to_string(index) + " is cut short");
  }
  return card;
}

}  // namespace

std::vector<std::string> Communicator::orderHandles(std::vector<std::string> handles) {
  std::vector<std::pair<std::string, std::string>> keyed;  // (host, handle)
  for (size_t i = 0; i < handles.size(); ++i) {
    const Locality where = Locality::decode(decodeHandle(handles[i], static_cast<int>(i)).locality);
    keyed.emplace_back(where.hostName + "/" + where.machineKey, std::move(handles[i]));
  }
  std::sort(keyed.begin(), keyed.end());
  handles.clear();
  for (auto& [host, h] : keyed) handles.push_back(std::move(h));
  return handles;
}

std::string Communicator::handle(Engine& engine) {
  Writer w;
  w.text(engine.localAddress());
  w.text(ProcessIdentity::self().encode());
  w.text(Locality::self().encode());
  return kHandlePrefix + toHex(w.take());
}

std::shared_ptr<Communicator> Communicator::reconfigure(Engine& engine,
                                                        const std::vector<std::string>& handles,
                                                        int64_t uuid,
                                                        std::chrono::milliseconds timeout,
                                                        const LinkCosts* links) {
  const std::string what = "reconfigure";
  const int n = static_cast<int>(handles.size());
  if (n == 0) throw Error("ddl: reconfigure: no handles given");
  if (static_cast<uint32_t>(n) > tag::kMaxRanks) {
    throw Error("ddl: reconfigure: " + std::to_string(n) + " handles; groups are limited to " +
                std::to_string(tag::kMaxRanks) + " ranks");
  }
  const std::string mine = handle(engine);
  std::vector<RankCard> cards(static_cast<size_t>(n));
  std::map<std::string, int> seen;
  int me = -1;
  for (int r = 0; r < n; ++r) {
    const std::string& h = handles[static_cast<size_t>(r)];
    cards[static_cast<size_t>(r)] = decodeHandle(h, r);
    auto [at, inserted] = seen.emplace(h, r);
    if (!inserted) {
      throw Error("ddl: reconfigure: handles " + std::to_string(at->second) + " and " +
                  std::to_string(r) + " are the same process's");
    }
    if (h == mine) me = r;
  }
  if (me < 0) {
    throw Error("ddl: reconfigure: this process's handle is not among the " + std::to_string(n) +
                " given (a process reconfigures only a group it is a member of)");
  }
  GroupDirectory directory = directoryFrom(cards, parseRackMap(config().topology), 0);
  if (!directory.error.ok()) throw Error(directory.error);
  // The members agree on what they were given and on an id, as a derived group's do, under a
  // sequence every member computes from the uuid.
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = me;
  agreement->size = n;
  agreement->id = tag::kAgreementGroup;
  agreement->name = "reconfigure " + std::to_string(uuid);
  agreement->addresses = directory.addresses;
  agreement->peers.assign(static_cast<size_t>(n), -1);
  // Under a sequence from the handles: processes given the same handles meet and compare their
  // uuids (a mismatch is named); processes given other lists cannot be waited for by name.
  std::string listed;
  for (const std::string& h : handles) listed += h + "\n";
  const uint64_t digest = std::hash<std::string>{}(listed);
  DeriveCard card;
  card.rank = me;
  card.parentRank = me;
  card.request = "reconfigure with uuid " + std::to_string(uuid);
  for (bool held : engine.heldGroupIds()) card.heldIds.push_back(held ? 1 : 0);
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  const auto sequence = static_cast<uint32_t>(digest & 0xffff);
  std::vector<ProcessIdentity> identities(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r != me && !directory.identities[r].empty()) {
      identities[r] = ProcessIdentity::decode(directory.identities[r]);
    }
  }
  engine.watch(agreement, identities);
  const DeriveResult result =
      runAgreement(agreement, sequence, members, std::move(card), what, timeout);
  if (!result.error.ok()) throw Error(result.error);
  if (!engine.claimGroupId(result.id)) {
    throw Error("ddl: reconfigure: the id " + std::to_string(result.id) +
                " agreed was taken here meanwhile (another group's creation); try again");
  }
  auto group = std::make_shared<Group>();
  group->rank = me;
  group->size = n;
  group->id = result.id;
  group->addresses = directory.addresses;
  group->peers.assign(static_cast<size_t>(n), -1);
  nameGroup(*group, engine);
  engine.openControl(group);
  engine.watch(group, identities);
  LinkCosts costs = links != nullptr ? *links : parseLinks(config().links);
  if (links == nullptr) costs.segmentBytes = static_cast<double>(config().segmentBytes);
  auto comm = std::shared_ptr<Communicator>(
      new Communicator(engine, group, timeout,
                       PlanBook::forMachine(std::move(directory.topology), std::move(costs),
                                            planRequest(), config().hierarchical)));
  comm->ownsId_ = true;
  comm->identities_ = std::move(identities);
  comm->logCreation(("reconfigured (uuid " + std::to_string(uuid) + ")").c_str());
  return comm;
}

void Communicator::close(const std::string& reason) {
  engine_->closeGroup(group_, Status(StatusKind::kClosed, reason));
}

bool Communicator::offersAdoption(size_t count, DataType type) {
  const Config& c = config();
  if (!c.shareTensors || count * elementSize(type) < c.directMinBytes ||
      (c.allreduceAlgorithm != AllreduceAlgorithm::kAuto &&
       c.allreduceAlgorithm != AllreduceAlgorithm::kDirect)) {
    return false;
  }
  return allreducePlan(count, type)->algorithm == PlanAlgorithm::kShared;
}

std::string Communicator::where(const char* name) const {
  return std::string("ddl: ") + name + " on " + group_->name + " (rank " + std::to_string(rank()) +
         " of " + std::to_string(size()) + ")";
}

std::shared_ptr<Work> Communicator::start(const CallPrint& print, const char* name,
                                          CallOptions& options,
                                          const std::function<Task(Op&)>& body,
                                          const void* inlineData, size_t inlineBytes) {
  return startAt(static_cast<uint32_t>(sequence_.fetch_add(1)), &print, name, options, body,
                 kNotPointToPoint, inlineData, inlineBytes);
}

std::shared_ptr<Work> Communicator::startAt(uint32_t sequence, const CallPrint* print,
                                            const char* name, CallOptions& options,
                                            const std::function<Task(Op&)>& body, int peer,
                                            const void* inlineData, size_t inlineBytes) {
  auto timeout = options.timeout.count() >= 0 ? options.timeout : timeout_;
  std::shared_ptr<Work> work = options.work ? options.work : std::make_shared<Work>(name);
  if (logs(LogLevel::kTrace)) {
    logLine(LogLevel::kTrace, group_->name + " rank " + std::to_string(rank()) + " op #" +
                                  std::to_string(sequence) + " " +
                                  (print != nullptr ? print->describe() : std::string(name)) +
                                  (peer >= 0 ? " with rank " + std::to_string(peer) : ""));
  }
  auto op = std::make_unique<Op>(group_, sequence, name, timeout, work);
  op->setMemory(options.memory == MemoryKind::kHost ? engine_->hostMemory()
                                                    : memoryFor(options.memory, options.device));
  op->traceRecord = engine_->runtime().recorder().created(group_->id, sequence, name,
                                                          print != nullptr ? *print : CallPrint{},
                                                          peer != kNotPointToPoint, peer, timeout);
  if (print != nullptr && size() > 1) {
    op->setPrint(*print);
    if (inlineBytes > 0) op->setInline(inlineData, inlineBytes);
    op->task = checkedCall(*op, body(*op));
  } else {
    op->task = body(*op);
  }
  if (!options.deferStart) {
    engine_->submit(std::move(op));
    return work;
  }
  Runtime* runtime = &engine_->runtime();
  auto held = std::make_shared<std::unique_ptr<Op>>(std::move(op));
  options.deferStart([runtime, held] { Runtime::submitIfAlive(runtime, std::move(*held)); });
  return work;
}

std::shared_ptr<Work> Communicator::allreduce(void* data, size_t count, DataType type,
                                              ReduceOp reduce, CallOptions options) {
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse("allreduce", bad);
  checkedBytes("allreduce", count, type);
  const Adoptable adoptable = options.adoptable;
  std::shared_ptr<const AllreducePlan> plan = options.plan;
  if (!plan) {
    plan = allreducePlan(count, type);
  } else if (plan->count != count || plan->elementSize != elementSize(type)) {
    refuse("allreduce", "the plan given is for " + std::to_string(plan->count) + " elements of " +
                            std::to_string(plan->elementSize) + " bytes");
  } else {
    try {
      checkPlan(*plan, size());
    } catch (const Error& e) {
      refuse("allreduce", e.what());
    }
  }
  // Two ranks, a small host allreduce: its data rides in the call print.
  const size_t bytes = count * elementSize(type);
  const bool carried = plan->algorithm == PlanAlgorithm::kRecursiveDoubling && size() == 2 &&
                       bytes > 0 && bytes <= Op::kInlineMax &&
                       options.memory == MemoryKind::kHost && engine_->hostMemory().holdsBytes();
  return start(
      callPrint(Collective::kAllreduce, count, type, reduce), "allreduce", options,
      [=](Op& op) { return allreduceTask(op, data, count, type, reduce, adoptable, plan); },
      carried ? data : nullptr, carried ? bytes : 0);
}

size_t Communicator::checkedBytes(const char* name, size_t count, DataType type, size_t times) {
  if (!fits(count, type, times)) {  // the message is built only when it is needed
    refuse(name, std::to_string(count) + " elements of " + dataTypeName(type) +
                     " overflow the address space");
  }
  return count * elementSize(type);
}

void Communicator::checkRoot(const char* name, int root) {
  if (root < 0 || root >= size())
    refuse(name, "rank " + std::to_string(root) + " is not a rank of it");
}

std::shared_ptr<Work> Communicator::broadcast(void* data, size_t count, DataType type, int root,
                                              CallOptions options) {
  checkRoot("broadcast", root);
  size_t bytes = checkedBytes("broadcast", count, type);
  return start(
      callPrint(Collective::kBroadcast, count, type, std::nullopt, root), "broadcast", options,
      [=, place = broadcastTreePlace(topology(), root, rank(), book_->hierarchical())](Op& op) {
        return broadcastTree(op, data, bytes, place, pipelineSettings(op));
      });
}

std::shared_ptr<Work> Communicator::allgather(const void* in, void* out, size_t count,
                                              DataType type, CallOptions options) {
  size_t bytes = checkedBytes("allgather", count, type, static_cast<size_t>(size()));
  return start(callPrint(Collective::kAllgather, count, type), "allgather", options,
               [=, stages = book_->blockStages(false)](Op& op) {
                 if (!stages->empty()) {
                   return allgatherGrid(op, in, out, bytes, stages, pipelineSettings(op));
                 }
                 return allgatherRing(op, in, out, bytes, pipelineSettings(op));
               });
}

std::shared_ptr<Work> Communicator::allgatherVarying(const void* in, size_t bytes,
                                                     std::shared_ptr<VaryingBlocks> out,
                                                     CallOptions options) {
  if (!out) refuse("allgather", "no output blocks given");
  return start(callPrint(Collective::kAllgatherVarying), "allgather", options, [=](Op& op) {
    return allgatherVaryingRing(op, in, bytes, out, pipelineSettings(op));
  });
}

std::shared_ptr<Work> Communicator::barrier(CallOptions options) {
  return start(callPrint(Collective::kBarrier), "barrier", options,
               [](Op& op) { return barrierDissemination(op); });
}

std::shared_ptr<Work> Communicator::monitoredBarrier(bool waitAll, CallOptions options) {
  // A diagnostic with its own protocol and error words: no call check, no notices.
  return startAt(static_cast<uint32_t>(sequence_.fetch_add(1)), nullptr, "monitored_barrier",
                 options, [=](Op& op) { return barrierMonitored(op, waitAll); });
}

std::shared_ptr<Work> Communicator::reduceScatter(void* data, size_t count, DataType type,
                                                  ReduceOp reduce, CallOptions options) {
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse("reduce_scatter", bad);
  checkedBytes("reduce_scatter", count, type, static_cast<size_t>(size()));
  return start(callPrint(Collective::kReduceScatter, count, type, reduce), "reduce_scatter",
               options, [=, stages = book_->blockStages(true)](Op& op) {
                 return reduceScatterTask(op, data, count, type, reduce, stages);
               });
}

std::shared_ptr<Work> Communicator::reduce(const void* in, void* out, size_t count, DataType type,
                                           ReduceOp reduce, int root, CallOptions options) {
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse("reduce", bad);
  checkRoot("reduce", root);
  checkedBytes("reduce", count, type);
  return start(callPrint(Collective::kReduce, count, type, reduce, root), "reduce", options,
               [=](Op& op) { return reduceTask(op, in, out, count, type, reduce, root); });
}

std::shared_ptr<Work> Communicator::gather(const void* in, void* out, size_t count, DataType type,
                                           int root, CallOptions options) {
  checkRoot("gather", root);
  size_t bytes = checkedBytes("gather", count, type, static_cast<size_t>(size()));
  return start(callPrint(Collective::kGather, count, type, std::nullopt, root), "gather", options,
               [=](Op& op) { return gatherLinear(op, in, out, bytes, root); });
}

std::shared_ptr<Work> Communicator::scatter(const void* in, void* out, size_t count, DataType type,
                                            int root, CallOptions options) {
  checkRoot("scatter", root);
  size_t bytes = checkedBytes("scatter", count, type, static_cast<size_t>(size()));
  return start(callPrint(Collective::kScatter, count, type, std::nullopt, root), "scatter", options,
               [=](Op& op) { return scatterLinear(op, in, out, bytes, root); });
}

std::shared_ptr<Work> Communicator::alltoall(const void* in, void* out, AlltoallLayout layout,
                                             CallOptions options) {
  const size_t n = static_cast<size_t>(size());
  if (layout.sendOffsets.size() != n || layout.sendBytes.size() != n ||
      layout.recvOffsets.size() != n || layout.recvBytes.size() != n) {
    refuse("all_to_all", "the layout must name one block per rank");
  }
  return start(callPrint(Collective::kAlltoall), "all_to_all", options,
               [=](Op& op) { return alltoallPairwise(op, in, out, layout); });
}

std::shared_ptr<Work> Communicator::send(const void* data, size_t bytes, int peer, uint32_t userTag,
                                         CallOptions options) {
  if (peer < 0 || peer >= size()) {  // point to point: outside the sequence, nobody to tell
    throw Error(where("send") + ": rank " + std::to_string(peer) + " is not a rank of it");
  }
  if (peer == rank()) throw Error(where("send") + ": a rank cannot send to itself");
  return startAt(
      userTag, nullptr, "send", options,
      [=](Op& op) { return sendTask(op, data, bytes, peer, userTag); }, peer);
}

std::shared_ptr<Work> Communicator::recv(void* data, size_t bytes, int peer, uint32_t userTag,
                                         CallOptions options) {
  if (peer < -1 || peer >= size()) {
    throw Error(where("recv") + ": rank " + std::to_string(peer) + " is not a rank of it");
  }
  if (peer == rank()) throw Error(where("recv") + ": a rank cannot receive from itself");
  return startAt(
      userTag, nullptr, "recv", options,
      [=](Op& op) { return recvTask(op, data, bytes, peer, userTag); }, peer);
}

std::shared_ptr<Work> Communicator::pointToPoint(std::vector<Transfer> transfers,
                                                 CallOptions options) {
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const char* what = t.isSend ? "send" : "recv";
    if (t.peer < 0 || t.peer >= size()) {
      throw Error(where("batch") + ": " + what + " " + std::to_string(i) + " names rank " +
                  std::to_string(t.peer) + ", not a rank of it" +
                  (t.peer == -1 && !t.isSend ? " (a batch receives from named ranks only)" : ""));
    }
    if (t.peer == rank()) {
      throw Error(where("batch") + ": " + what + " " + std::to_string(i) +
                  " names this rank; a rank cannot " + (t.isSend ? "send to" : "receive from") +
                  " itself");
    }
  }
  const uint32_t first = transfers.empty() ? 0 : transfers.front().userTag;
  return startAt(
      first, nullptr, "coalesced", options,
      [transfers = std::move(transfers)](Op& op) { return batchTask(op, transfers); }, -1);
}

}  // namespace ddl
