#include "status.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <sstream>

#include "runtime.h"
#include "stats.h"
#include "waits.h"

namespace ddl {

namespace {

std::string rankList(const std::set<int>& ranks) {
  std::string s = "[";
  for (int r : ranks) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
  return s + "]";
}

}  // namespace

std::string inFlightJson(Runtime& runtime) {
  const TimePoint now = runtime.clock().now();
  std::ostringstream out;
  out << "\"ops\": [";
  bool first = true;
  for (const auto& op : runtime.ops()) {
    const Group& g = op->group();
    const Waits waits = waitsOf(*op);
    out << (first ? "" : ", ") << "{\"group\": " << g.id
        << ", \"group_name\": " << jsonString(g.name) << ", \"rank\": " << g.rank
        << ", \"size\": " << g.size << ", \"op\": " << jsonString(op->name())
        << ", \"sequence\": " << op->sequence()
        << ", \"bytes\": " << op->callCheck().print().bytes() << ", \"running_s\": ";
    if (op->deadline() != TimePoint{}) {
      out << secondsBetween(op->deadline() - op->timeout(), now);
    } else {
      out << "null";
    }
    out << ", \"timeout_s\": " << std::chrono::duration<double>(op->timeout()).count()
        << ", \"awaits\": " << rankList(waits.peers)
        << ", \"not_started\": " << rankList(waits.notStarted)
        << ", \"waits\": " << jsonString(pendingPeers(*op)) << ", \"heartbeats_s\": {";
    // How long ago each awaited peer's last beat came (the peers this process watches).
    bool firstBeat = true;
    for (int r : waits.peers) {
      const std::string address = g.directory->known(r);
      if (address.empty()) continue;
      const std::optional<TimePoint> heard = runtime.heartbeat().heard(address);
      if (!heard) continue;
      out << (firstBeat ? "" : ", ") << "\"" << r << "\": " << secondsBetween(*heard, now);
      firstBeat = false;
    }
    out << "}, \"gone\": {";
    bool firstGone = true;
    for (int r : waits.peers) {
      const std::string address = g.directory->known(r);
      if (address.empty()) continue;
      auto lost = runtime.lost().find(address);
      if (lost == runtime.lost().end()) continue;
      out << (firstGone ? "" : ", ") << "\"" << r << "\": " << jsonString(lost->second.why);
      firstGone = false;
    }
    out << "}}";
    first = false;
  }
  out << "], \"lost\": " << runtime.lost().size()
      << ", \"watched\": " << runtime.heartbeat().watchedCount();
  return out.str();
}

std::string statusJson(Runtime& runtime, std::chrono::milliseconds wait) {
  struct Answer {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
    std::string text;
  };
  auto answer = std::make_shared<Answer>();
  const auto asked = std::chrono::steady_clock::now();
  Runtime::postIfAlive(&runtime, [answer, &runtime] {
    std::string text = inFlightJson(runtime);  // (runtime lives while its calls run)
    std::lock_guard<std::mutex> lock(answer->mutex);
    answer->text = std::move(text);
    answer->done = true;
    answer->ready.notify_all();
  });
  std::string inFlight;
  {
    std::unique_lock<std::mutex> lock(answer->mutex);
    if (answer->ready.wait_for(lock, wait, [&] { return answer->done; })) {
      inFlight = answer->text;
    }
  }
  const double answeredIn =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  std::ostringstream out;
  out << "{\"active_ops\": " << runtime.activeOps() << ", ";
  if (!inFlight.empty()) {
    out << "\"in_flight\": \"answered in " << static_cast<int>(answeredIn * 1e6) << " us\", "
        << inFlight;
  } else {
    out << "\"in_flight\": \"no answer from the progress thread within " << wait.count()
        << " ms (busy, e.g. in a long reduction, or stopped)\"";
  }
  out << ", \"stats\": " << runtime.stats().json(runtime.clock().now()) << "}";
  return out.str();
}

}  // namespace ddl
