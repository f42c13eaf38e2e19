// The progress thread of a real process: the driver that turns a Runtime (runtime.h) on a thread
// of its own. After the last activity it polls for TORCH_DDL_SPIN_US, then arms the transport
// and sleeps in poll(2) on the transport's wake-up fd, the watched peers' pidfds and its own
// eventfd (written when something is submitted) until the runtime's next timer, a second at
// most: an idle process costs next to no CPU. A simulated rank has no such driver: the
// simulator's event loop turns its runtime (sim/cluster.h).
//
// One thread at a time turns the runtime, and touches the transport: whoever holds the Turn. The
// progress thread takes it for each turn. A caller waiting for an op of its own on host memory
// takes it while the thread is between turns or asleep, and turns the runtime itself until its
// op ends or a spin passes (Work::wait): a small op then ends on the caller's thread, with no
// handoff to the progress thread and back, which on a core both share costs more than the op.
// An op whose caller waits at once (torch's asyncOp false) is submitted without waking the
// thread at all; the thread is woken when a caller hands the turn back with something left for
// it (an op of another caller, a submission, a notice), or stops waiting before its op ended.
// While a caller waits, the thread keeps off the turn even if awake (Turn::CallerWaits).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "../base/function_ref.h"
#include "runtime.h"

namespace ddl {

class ThreadDriver;

// The right to turn a runtime that a ThreadDriver drives, and the way to wake its thread. Shared
// by the driver and the Works it is lent to: a Work may outlive the driver, whose Turn then lends
// nothing.
class Turn {
 public:
  Turn();
  ~Turn();
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

  // Turns the runtime on this thread until `work` is done or `spin` passes with nothing
  // happening, if the turn is free now; returns at once otherwise. True when `work` is done.
  bool help(const Work& work, std::chrono::microseconds spin);
  // Runs `body` on this thread holding the turn, if the turn is free now and lent (as help()
  // takes it); true when it ran. `body` may read and change what the turning thread owns, and
  // submit ops; it should not take long (the thread keeps off meanwhile). `turns`: it turns the
  // runtime, so that the thread must look for what it took in from the transport as it hands the
  // turn back (leftForThread); a body that does not leaves the transport and timers as they were,
  // and what it submits is waited for by its caller or woke the thread as it was submitted.
  bool holding(FunctionRef<void(Runtime&)> body, bool turns = true);
  // Wakes the driver's thread if it sleeps (its eventfd).
  void wake();
  // While a caller waits for an op it was lent the turn for (Work::wait's spin), the thread
  // keeps off the turn: it would otherwise take it between the caller's turns, run the caller's
  // op itself and hand the result across (two switches, on a core they may share), and, kept
  // busy by ops that follow each other, spin on as long as they come.
  class CallerWaits {
   public:
    explicit CallerWaits(Turn& turn) : turn_(turn) { turn_.callersWaiting_.fetch_add(1); }
    ~CallerWaits() { turn_.callersWaiting_.fetch_sub(1); }
    CallerWaits(const CallerWaits&) = delete;
    CallerWaits& operator=(const CallerWaits&) = delete;

   private:
    Turn& turn_;
  };

 private:
  friend class ThreadDriver;

  std::mutex mutex_;                // held by whoever turns
  ThreadDriver* driver_ = nullptr;  // null once the driver stopped (under mutex_)
  std::atomic<bool> lent_{true};    // false for good once a device op was submitted
  int eventFd_ = -1;
  std::atomic<bool> sleeping_{false};                     // the thread sleeps, or is about to
  std::atomic<int> callersWaiting_{0};                    // CallerWaits
  std::atomic<TimePoint> sleepsUntil_{TimePoint::max()};  // when it wakes by itself
};

class ThreadDriver {
 public:
  // Starts turning `runtime` (which must outlive this driver).
  explicit ThreadDriver(Runtime& runtime);
  ThreadDriver(const ThreadDriver&) = delete;
  ThreadDriver& operator=(const ThreadDriver&) = delete;
  // Stops the runtime (on the thread: its ops in flight fail) and joins the thread.
  ~ThreadDriver();

  // Any thread, before `op` is submitted: lends the turn to its Work (an op on host memory). An
  // op on device memory makes the device current on the thread that resumes it: from the first
  // one on, the turn is lent to no Work (the caller's thread keeps its own device). True when
  // it was lent.
  bool lendTurn(Op& op);
  // Any thread: Turn::holding on this driver's turn, for a body that does not turn the runtime.
  bool holdingTurn(FunctionRef<void(Runtime&)> body);
  // Submits `op`; `waited`: its caller waits for it at once (Work::deferWake): the thread is not
  // woken for it when the turn is lent to its Work.
  void submit(std::unique_ptr<Op> op, bool waited);

 private:
  friend class Turn;
  void run();
  void sleep(std::unique_lock<std::mutex>& hold);  // lets go of the turn while asleep
  // While a caller turns: sleeps until it hands the turn back with something left for this
  // thread, or kAwaitHandBack passes (a caller holds the turn for a spin at most). True when
  // it was woken (something is left for it).
  bool awaitHandBack();
  // While a caller waits (Turn::CallerWaits): sleeps until woken or kAwaitHandBack passes. True
  // when woken: the caller left something to this thread, which then turns although it waits.
  bool keepOff();
  // Both: marked asleep, and then, if `stillAway()` (looked at once marked, so that a caller
  // that leaves something after it sees the thread asleep and wakes it), sleeps on the eventfd
  // until woken or kAwaitHandBack passes. True when woken.
  bool nap(FunctionRef<bool()> stillAway);
  static constexpr std::chrono::milliseconds kAwaitHandBack{1};
  // Under the turn's mutex, as a caller hands the turn back: whether the thread must turn
  // before it would wake by itself (ops of others, submissions, notices the caller's turns took
  // in from the transport, a timer due sooner).
  bool leftForThread();

  Runtime& runtime_;
  std::shared_ptr<Turn> turn_ = std::make_shared<Turn>();
  std::thread thread_;
};

}  // namespace ddl
