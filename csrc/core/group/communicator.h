// Communicator: a group's view of the engine (its ranks, tag space and sequence numbers) and the
// entry point of every collective. Each call checks its arguments, picks an algorithm, and
// submits an Op; it returns at once with the Work. Nothing is sent when a check fails.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "../algorithms/algorithms.h"
#include "../algorithms/dispatch.h"
#include "../base/config.h"
#include "../base/function_ref.h"
#include "../runtime/work.h"
#include "../topology/allreduce_plan.h"
#include "../topology/block_plan.h"
#include "../topology/plan_book.h"
#include "../topology/topology.h"
#include "agreement.h"
#include "bootstrap.h"
#include "creation.h"
#include "derivation.h"
#include "engine.h"
#include "store.h"

namespace ddl {

struct CallOptions {
  std::chrono::milliseconds timeout{-1};  // negative: the group's timeout
  // The Work to finish; a caller that installs a completion hook creates it. Default: a new one.
  std::shared_ptr<Work> work;
  // allreduce: the allocation holding the tensor, when the caller has seen it allreduced before.
  // It may be moved into shared memory in place (SharedBuffers::adopt), so that this and later
  // allreduces of it take the direct path.
  Adoptable adoptable;
  // Where the buffers live (a device kind needs a build with its module: see memory/memory.h).
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  // When set, the op is numbered now (its place in the group's order) but submitted only when
  // deferStart calls the function it is given, from any thread: e.g. once a device stream has
  // produced the input.
  std::function<void(std::function<void()>)> deferStart;
  // allreduce: this plan, e.g. the group's own that the caller looked up (allreducePlan), or one
  // built by hand (tests; every rank passes an equal one, checked unless the planner made it).
  std::shared_ptr<const AllreducePlan> plan;
  // A collective made for another call (a window's: group/window.h): checked against the other
  // ranks' calls as that call, and named so. `asCount` takes the print's count.
  std::optional<Collective> as;
  uint64_t asCount = 0;
  // The caller waits for the Work at once (torch's asyncOp false): the progress thread is not
  // woken for the op, the caller's wait turns the runtime (runtime/driver.h). One that does not
  // wait after all calls Work::wakeIfDeferred.
  bool waited = false;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Collective over `size` processes: finds the group's id and its tree parent through `store`
  // and learns every rank's address and locality over the group's own messages
  // (group/bootstrap.h); connects to peers as its operations first need them.
  static std::shared_ptr<Communicator> create(Engine& engine, std::shared_ptr<KeyValueStore> store,
                                              int rank, int size, std::chrono::milliseconds timeout,
                                              const Topology* simulated = nullptr);
  // create() in two halves, for a driver that must not block: group/creation.h.

  ~Communicator();

  int rank() const { return group_->rank; }
  int size() const { return group_->size; }
  uint32_t id() const { return group_->id; }
  Engine& engine() const { return *engine_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // Operations started on this group so far.
  uint64_t sequenceNumber() const { return sequence_.load(); }
  // Tests and the fault campaign: the next op's number (every rank of the group sets the same,
  // before its first op), to run a group as if it had run that many ops (the counters' wraps).
  void startSequenceAt(uint64_t next) { sequence_.store(next); }
  // The levels found at creation, and the link costs the planner weighs.
  const Topology& topology() const { return book_->topology(); }
  const LinkCosts& links() const { return book_->links(); }
  PlanBook& planBook() const { return *book_; }
  // The host-level rings of multidim allreduces set up so far: how many move their bytes
  // through shared-memory slots, and how many over messages (their ranks could not map each
  // other's windows). Asks the progress thread.
  std::pair<int, int> hostRings();
  // Measures the figures of `links` that need it (group/link_probe.h) as if the group ran on
  // `topology`, in an op of this group; `links` is written once the Work is done. Creation does
  // this for the machine it found; tests probe machines they make up.
  std::shared_ptr<Work> probe(const Topology& topology, LinkCosts* links);
  // A group of this group's ranks but `excluded` (ranks of this group), made by the others
  // alone (group/agreement.h): this one's machine, links and plans' settings, its endpoints, no
  // store. Every remaining rank calls it with the same set (else each gets an error naming who
  // was asked what); the excluded ranks do not call it and are not waited for: this group may
  // have failed because they died. `abortFirst` (torch's SHRINK_ABORT) first fails this
  // group's ops in flight. `requireQuorum`: the ranks left must be more than half of this group,
  // or half with its rank 0 (kPartitioned otherwise): of two sides of a partition only one goes
  // on; a caller that knows the others are dead may say it does not require it. Throws on bad
  // arguments (and a missing quorum) before any message leaves.
  std::shared_ptr<Communicator> shrink(const std::vector<int>& excluded, bool abortFirst = false,
                                       bool requireQuorum = true);
  // A group of `ranks` of this one (torch's split), made by them alone as shrink's is; the
  // ranks that are not in it get nullptr and send nothing.
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks);
  // torch 2.14's reconfigure (survivors, or a grown set, form a group again without restarting
  // processes): a group of the processes whose handles (Derivation::handle) are listed (this
  // one among them; its rank is its handle's place), made over messages between them alone, no
  // store: every listed process calls it with the same handles and `uuid` (else each gets an
  // error naming who was given what) and none waits for a process that is not listed. `links`:
  // the link figures to plan with (a group's probed ones; TORCH_DDL_LINKS's when null). Throws
  // on bad handles before any message leaves.
  static std::shared_ptr<Communicator> reconfigure(Engine& engine,
                                                   const std::vector<std::string>& handles,
                                                   int64_t uuid, std::chrono::milliseconds timeout,
                                                   const LinkCosts* links = nullptr);
  // shrink, split and reconfigure in two halves, for a driver that must not block:
  // group/derivation.h.
  // Closes the group: its ops in flight fail now with `reason`, and so does every later one
  // (abort(), shutdown()). Returns once they have failed.
  void close(const std::string& reason);
  // A caller whose collective `name` refused its arguments before calling it here (the torch
  // glue's checks) tells the other ranks: the op they are in fails with `why`, and the group
  // goes on. Takes the op's place in the sequence. The collectives below do this themselves
  // for the arguments they check.
  void reject(const char* name, const std::string& why) noexcept;
  // The group's first failed op: how it ended (ok while every op succeeded), and whether another
  // rank's report ended it.
  GroupState::Failure firstFailure() const { return group_->state->firstFailure(); }
  // The ranks of this group known here to be gone (found here, or named by another rank), in
  // ascending order: what a shrink after a failure excludes.
  std::vector<int> goneRanks() const { return group_->state->gone(); }
  std::optional<TimePoint> goneSince(int rank) const { return group_->state->goneSince(rank); }
  // The allreduce plan for `count` elements of `type` (cached per size; plan->offersAdoption
  // says whether to hand the op a buffer to adopt, CallOptions::adoptable), and the request the
  // configuration makes of the planner (a group keeps the one in effect when it was created).
  std::shared_ptr<const AllreducePlan> allreducePlan(size_t count, DataType type);

  std::shared_ptr<Work> allreduce(void* data, size_t count, DataType type, ReduceOp op,
                                  CallOptions options = {});
  std::shared_ptr<Work> broadcast(void* data, size_t count, DataType type, int root,
                                  CallOptions options = {});
  // `out` holds size() * count elements; `in` may point at block rank() of it.
  std::shared_ptr<Work> allgather(const void* in, void* out, size_t count, DataType type,
                                  CallOptions options = {});
  // Blocks of different sizes (each rank's `bytes` of `in`), gathered into `out` in rank order.
  std::shared_ptr<Work> allgatherVarying(const void* in, size_t bytes,
                                         std::shared_ptr<VaryingBlocks> out,
                                         CallOptions options = {});
  std::shared_ptr<Work> barrier(CallOptions options = {});
  // A barrier through rank 0 whose timeout error names the lowest rank that did not arrive (all
  // of them with `waitAll`).
  std::shared_ptr<Work> monitoredBarrier(bool waitAll = true, CallOptions options = {});
  // `data` holds size() blocks of `count`; block rank() ends reduced, the rest is scratch.
  std::shared_ptr<Work> reduceScatter(void* data, size_t count, DataType type, ReduceOp op,
                                      CallOptions options = {});
  // `out` is used at the root only and may alias `in`.
  std::shared_ptr<Work> reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                               int root, CallOptions options = {});
  // `out` (root only) holds size() blocks of `count`.
  std::shared_ptr<Work> gather(const void* in, void* out, size_t count, DataType type, int root,
                               CallOptions options = {});
  // `in` (root only) holds size() blocks of `count`.
  std::shared_ptr<Work> scatter(const void* in, void* out, size_t count, DataType type, int root,
                                CallOptions options = {});
  // Byte layout per peer; `in` and `out` must not overlap.
  std::shared_ptr<Work> alltoall(const void* in, void* out, AlltoallLayout layout,
                                 CallOptions options = {});
  // Point to point, outside the collective sequence. recv from peer -1 takes any source; the
  // Work's source() names the sender.
  std::shared_ptr<Work> send(const void* data, size_t bytes, int peer, uint32_t userTag,
                             CallOptions options = {});
  std::shared_ptr<Work> recv(void* data, size_t bytes, int peer, uint32_t userTag,
                             CallOptions options = {});
  // One transfer of a point-to-point batch (algorithms/dispatch.h).
  using Transfer = ddl::Transfer;
  // Several sends and receives as one op (torch's batch_isend_irecv, a coalesced batch): all
  // posted at once in the order given, each matched as the lone send or recv of its tag would
  // be; done when all are, failing with the first that fails (naming the peers still awaited).
  // Checks every transfer before any is posted.
  std::shared_ptr<Work> pointToPoint(std::vector<Transfer> transfers, CallOptions options = {});

 private:
  Communicator(Engine& engine, std::shared_ptr<Group> group, std::chrono::milliseconds timeout,
               std::shared_ptr<PlanBook> book);
  // A collective: numbered, checked against the other ranks' calls (runtime/call_print.h), and
  // named by its collective. `inlineBytes` of `inlineData` ride in the call print
  // (CallCheck::setInline).
  std::shared_ptr<Work> start(const CallPrint& print, CallOptions& options,
                              FunctionRef<Task(Op&)> body, const void* inlineData = nullptr,
                              size_t inlineBytes = 0);
  // `print` null: outside the call checks (point to point, monitored barriers). `peer`: the
  // other rank of a point-to-point op (-1: any), kNotPointToPoint for the others.
  static constexpr int kNotPointToPoint = -2;
  std::shared_ptr<Work> startAt(uint32_t sequence, const CallPrint* print, const char* name,
                                CallOptions& options, FunctionRef<Task(Op&)> body,
                                int peer = kNotPointToPoint, const void* inlineData = nullptr,
                                size_t inlineBytes = 0);
  // startAt for ops of `group` (a window's, group/window.h: this group's ranks under ids of
  // their own).
  std::shared_ptr<Work> startOn(const std::shared_ptr<const Group>& group, uint32_t sequence,
                                const CallPrint* print, const char* name, CallOptions& options,
                                FunctionRef<Task(Op&)> body, int peer,
                                const void* inlineData = nullptr, size_t inlineBytes = 0);
  friend class Window;
  // A one-step allreduce (plan.once) its caller waits for, run on the caller's thread where the
  // runtime's turn is free and nothing else of the group is in flight (group/quick.cc): its
  // Work, finished or handed to an op that took over; null where it was not taken (nothing was
  // numbered or touched).
  std::shared_ptr<Work> allreduceQuick(void* data, size_t count, DataType type, ReduceOp reduce,
                                       CallOptions& options);
  std::string where(const char* name) const;
  // Bad arguments: the other ranks are told (reject) and the caller gets an Error of
  // kInvalidArgument.
  [[noreturn]] void refuse(const char* name, const std::string& what);
  void checkRoot(const char* name, int root);
  // count * elementSize(type); refuses when `times` such blocks overflow size_t.
  size_t checkedBytes(const char* name, size_t count, DataType type, size_t times = 1);

  friend class Creation;
  friend class Derivation;
  // The agreement's sequence for the next call `what` of this group (a shrink, a split).
  uint32_t nextAgreement(const char* what);
  // A group's runtime and shared buffers (the engine's), its name, its entry in the flight
  // recorder and its shared-memory ring, once its rank, size and id are set.
  static void nameGroup(Group& group, Engine& engine);

  // INFO log: the group's machine and links, once it exists (`how`: created, derived ...).
  void logCreation(const char* how) const;

  Engine* engine_;
  std::shared_ptr<const Group> group_;
  std::atomic<uint64_t> loggedSizes_{0};  // allreduce size classes logged (bit k: 2^(k-1) bytes)
  Identities identities_;  // of this rank's host's other ranks (none where simulated)
  std::map<std::string, uint32_t> derivations_;  // agreements made so far, by call
  bool ownsId_ = false;  // gives the group's id back to the engine when destroyed
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> sequence_{0};
  // The group's machine, link figures and plans, shared with the process's other groups of the
  // same (topology/plan_book.h). Set at creation (again once the links are probed), read-only
  // after.
  std::shared_ptr<PlanBook> book_;
};

}  // namespace ddl
