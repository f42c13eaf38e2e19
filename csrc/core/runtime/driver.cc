#include "driver.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "../base/types.h"

namespace ddl {

ThreadDriver::ThreadDriver(Runtime& runtime) : runtime_(runtime) {
  eventFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (eventFd_ < 0) throw Error("ddl: eventfd failed");
  runtime_.setWakeHook([this] { wake(); });
  thread_ = std::thread([this] { run(); });
  runtime_.setDriverThread(thread_.get_id());
}

ThreadDriver::~ThreadDriver() {
  runtime_.requestStop();
  thread_.join();
  runtime_.setWakeHook(nullptr);
  runtime_.setDriverThread(std::thread::id());
  close(eventFd_);
}

void ThreadDriver::wake() {
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!write(eventFd_, &one, sizeof(one));
  }
}

void ThreadDriver::sleep() {
  sleeping_.store(true);
  Transport& transport = runtime_.transport();
  if (!runtime_.hasSubmissions() && transport.arm()) {
    int timeoutMs = -1;
    const TimePoint next = runtime_.nextTimer();
    if (next != TimePoint::max()) {
      auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next - runtime_.clock().now());
      timeoutMs = static_cast<int>(std::clamp<long>(wait.count() + 1, 0, 1000));
    }
    std::vector<pollfd> fds = {{eventFd_, POLLIN, 0}};
    if (transport.wakeFd() >= 0) {
      fds.push_back({transport.wakeFd(), POLLIN, 0});
    } else if (timeoutMs < 0) {
      timeoutMs = 1;
    }
    for (int fd : runtime_.watchedFds()) fds.push_back({fd, POLLIN, 0});  // a watched peer exits
    poll(fds.data(), fds.size(), timeoutMs);
  }
  sleeping_.store(false);
  uint64_t counter;
  (void)!read(eventFd_, &counter, sizeof(counter));
}

void ThreadDriver::run() {
  const Clock& clock = runtime_.clock();
  auto lastActivity = clock.now();
  while (true) {
    const bool busy = runtime_.turn();
    const TimePoint now = clock.now();
    if (runtime_.stopping()) break;
    if (busy) {
      lastActivity = now;
      continue;
    }
    if (now - lastActivity < std::chrono::microseconds(runtime_.config().spinMicros)) {
      sched_yield();
      continue;
    }
    if (runtime_.idle()) continue;  // no notice is left untaken
    sleep();
    lastActivity = clock.now();
  }
  runtime_.stop();
}

}  // namespace ddl
