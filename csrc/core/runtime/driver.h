// The progress thread of a real process: the driver that turns a Runtime (runtime.h) on a thread
// of its own, the only thread that touches the transport. After the last activity it polls for
// TORCH_DDL_SPIN_US, then arms the transport and sleeps in poll(2) on the transport's wake-up fd,
// the watched peers' pidfds and its own eventfd (written when something is submitted) until the
// runtime's next timer: an idle process costs no CPU. A simulated rank has no such driver: the
// simulator's event loop turns its runtime (sim/cluster.h).
#pragma once

#include <atomic>
#include <thread>

#include "runtime.h"

namespace ddl {

class ThreadDriver {
 public:
  // Starts turning `runtime` (which must outlive this driver).
  explicit ThreadDriver(Runtime& runtime);
  ThreadDriver(const ThreadDriver&) = delete;
  ThreadDriver& operator=(const ThreadDriver&) = delete;
  // Stops the runtime (on the thread: its ops in flight fail) and joins the thread.
  ~ThreadDriver();

 private:
  void run();
  void sleep();
  void wake();

  Runtime& runtime_;
  int eventFd_ = -1;
  std::atomic<bool> sleeping_{false};
  std::thread thread_;
};

}  // namespace ddl
