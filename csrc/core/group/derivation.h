// shrink, split and reconfigure: groups made without the store, by the ranks that will be in
// them (group/agreement.h). A Derivation is one such call in two halves, so that a driver that
// must not block (the simulator) runs it as it runs collectives: shrink(), split() and
// reconfigure() check the arguments (throwing before any message leaves) and start the
// agreement; once work() is done, finish() makes the group (nullptr for a rank a split leaves
// out), or throws why it could not. Communicator's blocking calls are the two halves with a wait
// between (await()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../base/status.h"
#include "../runtime/liveness.h"
#include "../runtime/work.h"
#include "../topology/allreduce_plan.h"
#include "../topology/topology.h"
#include "agreement.h"

namespace ddl {

class Communicator;
class Engine;

class Derivation {
 public:
  // Communicator::shrink, split and reconfigure's first halves (see there).
  static std::unique_ptr<Derivation> shrink(Communicator& parent, const std::vector<int>& excluded,
                                            bool abortFirst = false, bool requireQuorum = true);
  static std::unique_ptr<Derivation> split(Communicator& parent, const std::vector<int>& ranks);
  static std::unique_ptr<Derivation> reconfigure(Engine& engine,
                                                 const std::vector<std::string>& handles,
                                                 int64_t uuid, std::chrono::milliseconds timeout,
                                                 const LinkCosts* links = nullptr);
  // What peers need to reach this process (its address, identity and locality), as text, to be
  // passed around out of band for a reconfigure.
  static std::string handle(Engine& engine);
  // Handles in an order every process computes alike: by host, then by handle (a set of
  // handles, whose order torch leaves to the backend). Throws on a handle that is not ddl's.
  static std::vector<std::string> orderHandles(std::vector<std::string> handles);

  // The agreement's.
  const std::shared_ptr<Work>& work() const { return work_; }
  // The second half, once work() is done.
  std::shared_ptr<Communicator> finish();
  // Waits for work(), then finish().
  std::shared_ptr<Communicator> await();

 private:
  Derivation(Engine& engine, std::string what)
      : engine_(&engine), what_(std::move(what)), result_(std::make_shared<DeriveResult>()) {}
  // Starts the members' agreement on `request` under `sequence`, to derive a group of `members`
  // (ranks of `parent`, ascending). `excluded` (a shrink's): the ranks this rank's request leaves
  // out, told so first; their words are waited for (to leave, not to arrive) for kTellWait at
  // most.
  static constexpr std::chrono::milliseconds kTellWait{200};
  static std::unique_ptr<Derivation> start(Communicator& parent, const RankSet& members,
                                           const std::string& request, const char* what,
                                           uint32_t sequence,
                                           const std::vector<int>& excluded = {});
  // A call `what` (agreement `sequence`) that this rank refused before its agreement began: the
  // others are told, so that theirs fails at once naming the refusal. Returns `error`.
  static Error refuse(Communicator& parent, const char* what, uint32_t sequence, Error error);
  // The group a member makes once the agreement is done: rank `place`, the members' addresses
  // and identities (by parent rank), the parent's machine restricted to them, its settings.
  void describe(const Communicator& parent, const RankSet& members, int place,
                const Identities& identities);

  Engine* engine_ = nullptr;
  std::string what_;                      // "shrink_group", "split_group", "reconfigure"
  std::shared_ptr<Work> work_;            // the agreement's
  std::shared_ptr<DeriveResult> result_;  // its decision
  // A reconfigure into a wide group: the agreement ids its agreement carries, held until it ends
  // (Engine::holdAgreementIds).
  std::shared_ptr<void> agreementIds_;
  bool member_ = true;  // false: a rank a split leaves out (nothing to make)
  // The group this rank makes once the agreement is done (its rank, every rank's address and
  // process identity, the machine and the planner's settings).
  int rank_ = 0;
  std::shared_ptr<PeerDirectory> directory_;  // the group made's
  int size_ = 0;
  Identities identities_;
  Topology topology_;
  LinkCosts links_;
  PlanRequest request_;
  bool hierarchical_ = true;
  std::chrono::milliseconds timeout_{0};
  std::string how_;  // for the log: "derived from group 3"
};

}  // namespace ddl
