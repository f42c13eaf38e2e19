#include "creation.h"

#include "../base/config.h"
#include "../base/log.h"
#include "../base/tag.h"
#include "../shm/shared_ring.h"
#include "communicator.h"
#include "link_probe.h"

namespace ddl {
namespace {

// A round up the creation tree and back down. The store serves the ranks' lookups one at a
// time: a rank whose creation ended at its own lookup's answer began watching its peers
// (heartbeats) while those queued behind it were still waiting, and counted one gone once that
// wait passed 2 s (4 096 ranks with a store of 700 us an answer; 69 632 at the measured 31 us).
Task everyoneLookedUp(Op& op) {
  const uint64_t slot = tag::slot(tag::kControlPhase, tag::kReadyStep);
  const int up = bootstrapParent(op.rank());
  const std::vector<int> children = bootstrapChildren(op.rank(), op.size());
  char token = 0;
  std::vector<char> tokens(children.size());
  std::vector<Request*> requests;
  for (size_t i = 0; i < children.size(); ++i) {
    requests.push_back(op.recv(children[i], slot, &tokens[i], 1));
  }
  co_await op.all(requests);
  if (up >= 0) {
    co_await op.all(op.send(up, slot, &token, 1));
    co_await op.all(op.recv(up, slot, &token, 1));
  }
  requests.clear();
  for (int child : children) requests.push_back(op.send(child, slot, &token, 1));
  co_await op.all(requests);
}

// Why this rank cannot be of a group whose rank 0 wrote `groupId` (the id, then its
// agreedSettings): the settings that differ, named ("" where none does).
std::string settingsRefusal(const Config& mine, int rank, const std::string& groupId) {
  const size_t settingsAt = std::min(groupId.find('\n'), groupId.size());
  const std::string theirs = settingsAt < groupId.size() ? groupId.substr(settingsAt + 1) : "";
  const std::string words = differenceWords(settingDifferences(agreedSettings(mine), theirs),
                                            "on rank " + std::to_string(rank), "on rank 0");
  if (words.empty()) return "";
  return "ddl: the ranks' settings differ where they choose what an op runs, so their ops would "
         "not meet: " +
         words + ". Set them alike on every rank";
}

void checkRankOf(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("ddl: rank " + std::to_string(rank) + " is outside a group of size " +
                std::to_string(size));
  }
  if (static_cast<uint32_t>(size) > tag::kMaxRanks) {
    throw Error("ddl: groups are limited to " + std::to_string(tag::kMaxRanks) + " ranks");
  }
}

// A directory that looks addresses up in `store`, under `keyOf(rank)`. Looked up from inside an
// op, on the turning thread: the runtime's beats go on while the store answers
// (Runtime::callOutside).
std::shared_ptr<PeerDirectory> storeDirectory(std::shared_ptr<KeyValueStore> store,
                                              std::function<std::string(int)> keyOf,
                                              Runtime& runtime) {
  return std::make_shared<PeerDirectory>(
      [store, keyOf, &runtime](int r) {
        std::string address;
        runtime.callOutside([&] { address = store->get(keyOf(r)); });
        return address;
      },
      [store, keyOf, &runtime](const std::vector<int>& ranks) {
        std::vector<std::string> keys;
        for (int r : ranks) keys.push_back(keyOf(r));
        std::vector<std::string> addresses;
        runtime.callOutside([&] { addresses = store->multiGet(keys); });
        return addresses;
      });
}

// The creation op: the exchange (bootstrap.h), then, where the machine spans hosts and its
// figures are neither given nor measured before, the link probe (link_probe.h).
Task createGroup(Op& op, Engine* engine, std::shared_ptr<Group> group, RankCard mine,
                 std::string refusal, std::shared_ptr<const RackMap> racks,
                 std::shared_ptr<Bootstrapped> bootstrapped, const Topology* given,
                 std::string links, std::shared_ptr<Creation::Found> out) {
  co_await bootstrapGroup(op, group, std::move(mine), std::move(refusal), std::move(racks),
                          bootstrapped);
  if (!bootstrapped->error.ok()) co_return;
  out->topology = given != nullptr ? *given : std::move(bootstrapped->topology);
  if (out->topology.size != group->size) {
    throw Error("ddl: the topology given is for another group size", StatusKind::kInvalidArgument);
  }
  // The peers this rank's rings and rounds meet that creation did not tell it of, in one
  // request to the store (bootstrap.h).
  if (group->size > 1) group->directory->prefetch(ringPartners(out->topology, group->rank));
  co_await everyoneLookedUp(op);
  out->links = parseLinks(links);
  out->links.segmentBytes = static_cast<double>(engine->config().segmentBytes);
  // Measured on the machine found only: a topology given instead has no links to measure.
  if (given == nullptr) co_await probeLinks(op, *engine, out->topology, &out->links);
}

}  // namespace

uint32_t parseGroupId(const std::string& text, const std::string& key) {
  const std::string value = text.substr(0, text.find('\n'));  // then rank 0's settings
  uint64_t id = 0;
  bool digits = !value.empty() && value.size() <= 10;
  for (char c : value) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) id = id * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!digits || id >= tag::kGroupIds) {
    throw Error("ddl: the store's " + key + " is \"" + value.substr(0, 32) +
                    "\", not a group id (a number below " + std::to_string(tag::kGroupIds) +
                    "): another program wrote it, or the store is not this job's",
                StatusKind::kInvalidArgument);
  }
  return static_cast<uint32_t>(id);
}

Creation::~Creation() {
  if (claimed_) {
    Engine::releaseGroupIdIfAlive(engine_, group_->id, tag::wideBits(group_->size));
  }
}

std::unique_ptr<Creation> Creation::begin(Engine& engine, std::shared_ptr<KeyValueStore> shared,
                                          int rank, int size, const GroupOptions& options) {
  KeyValueStore& store = *shared;
  checkRankOf(rank, size);
  auto pending = std::unique_ptr<Creation>(new Creation());
  pending->engine_ = &engine;
  pending->options_ = options;
  auto group = std::make_shared<Group>();
  pending->group_ = group;
  group->rank = rank;
  group->size = size;
  // The store may hold the keys of an earlier creation of a group with this prefix (a group
  // destroyed and created again; a FileStore reused): every rank counts itself in, and the
  // creation the count falls in names this one's keys, so nobody reads a stale value.
  const int64_t joined = store.add("ddl/joined", 1);
  const std::string key = "ddl/" + std::to_string((joined - 1) / size) + "/";
  // Every rank's address is in the store, under the creation's keys. A rank other than 0 sets
  // its own, then reads the group id with its predecessor's address (the last rank rank 0's too)
  // in one request; another peer's when it first sends to it (bootstrap.h).
  auto addressKey = [key](int r) { return key + "address/" + std::to_string(r); };
  const std::string address = engine.localAddress();
  std::vector<std::string> known;  // group id, then the addresses of `knownRanks`
  std::vector<int> knownRanks;
  std::string refusal;  // why this rank cannot be of the group
  if (rank == 0) {
    group->id = tag::groupIdOf(store.nextGroupNumber(), tag::wideBits(size));
    // With rank 0's settings, which the others compare with theirs (in the same request).
    store.set(key + "group_id", std::to_string(group->id) + "\n" + agreedSettings(engine.config()));
    if (size > 1) store.set(addressKey(0), address);
  } else {
    store.set(addressKey(rank), address);
    knownRanks.push_back(rank - 1);
    if (rank == size - 1 && size > 2) knownRanks.push_back(0);
    std::vector<std::string> keys{key + "group_id"};
    for (int r : knownRanks) keys.push_back(addressKey(r));
    known = store.multiGet(keys);
    if (known.size() != keys.size()) {
      throw Error("ddl: the store answered " + std::to_string(known.size()) + " values for " +
                  std::to_string(keys.size()) + " keys");
    }
    group->id = parseGroupId(known[0], key + "group_id");
    refusal = settingsRefusal(engine.config(), rank, known[0]);
  }
  Communicator::nameGroup(*group, engine);
  engine.runtime().recorder().noteRank(rank);
  RankCard card;
  card.rank = rank;
  card.address = address;
  card.identity = options.identity ? *options.identity : ProcessIdentity::self().encode();
  card.locality = (options.locality ? *options.locality : Locality::self()).encode();
  card.idTaken = !engine.claimGroupId(group->id, tag::wideBits(size));
  pending->claimed_ = !card.idTaken;
  group->directory = storeDirectory(shared, addressKey, engine.runtime());
  for (size_t i = 0; i < knownRanks.size(); ++i) {
    group->directory->learn(knownRanks[i], known[i + 1]);
  }
  pending->bootstrapped_ = std::make_shared<Bootstrapped>();
  pending->work_ = std::make_shared<Work>("group creation");
  auto op = std::make_unique<Op>(group, 0, "group creation", options.timeout, pending->work_);
  const Config& settings = engine.config();
  const std::string racks = options.racks ? *options.racks : settings.topology;
  pending->found_ = std::make_shared<Found>();
  op->task = createGroup(*op, &engine, group, std::move(card), std::move(refusal),
                         sharedRackMap(racks), pending->bootstrapped_, options.topology,
                         options.links ? *options.links : settings.links, pending->found_);
  engine.submit(std::move(op));
  return pending;
}

std::shared_ptr<Communicator> Creation::finish() {
  if (!work_->done()) throw Error("ddl: the group's creation has not finished");
  if (work_->failed()) throw Error(work_->error());
  Bootstrapped& bootstrapped = *bootstrapped_;
  if (!bootstrapped.error.ok()) throw Error(bootstrapped.error);
  std::shared_ptr<Group> group = group_;
  Engine& engine = *engine_;
  const GroupOptions& options = options_;
  group->incarnation = bootstrapped.incarnation;
  const Config& settings = engine.config();
  PlanRequest request = options.plan ? *options.plan : planRequest(settings);
  std::shared_ptr<PlanBook> book = PlanBook::forMachine(
      std::move(found_->topology), std::move(found_->links), request, settings.hierarchical);
  group->printRing = printRing(group->rank, group->size, book->blockStages(false).get());
  engine.notices().open(group);
  // Peers on this host are watched: one that exits fails the group's ops at once (liveness.h).
  Identities identities;
  for (const auto& [r, identity] : bootstrapped.hostIdentities) {
    identities.emplace(r, ProcessIdentity::decode(identity));
  }
  engine.watch(group, identities);
  bootstrapped = Bootstrapped{};
  auto comm = std::shared_ptr<Communicator>(
      new Communicator(engine, group, options.timeout, std::move(book)));
  comm->ownsId_ = claimed_;
  comm->identities_ = std::move(identities);
  claimed_ = false;
  comm->logCreation("created");
  return comm;
}

std::shared_ptr<Communicator> Creation::await() {
  work_->wait();
  return finish();
}

}  // namespace ddl
