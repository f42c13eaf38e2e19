// Thread-per-rank harness: every rank gets its own Engine (and progress thread) over a shared
// in-process transport, and a Communicator created through an in-memory store, as processes do.
#pragma once

#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../../csrc/core/base/config.h"
#include "../../csrc/core/group/communicator.h"
#include "../../csrc/core/group/notice.h"
#include "../../csrc/core/transport/loopback/loopback.h"

namespace ddl::test {

class MemoryStore : public KeyValueStore {
 public:
  // Stores of one job share the group counter, as the c10d stores of one job share a root store.
  explicit MemoryStore(
      std::shared_ptr<std::atomic<uint64_t>> counter = std::make_shared<std::atomic<uint64_t>>(0))
      : counter_(std::move(counter)) {}
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    cv_.notify_all();
  }
  std::string get(const std::string& key) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return values_.count(key) > 0; })) {
      throw Error("store: timed out waiting for " + key);
    }
    return values_[key];
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t sum = (values_.count(key) ? std::stoll(values_[key]) : 0) + delta;
    values_[key] = std::to_string(sum);
    cv_.notify_all();
    return sum;
  }
  uint64_t nextGroupNumber() override { return (*counter_)++; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  std::shared_ptr<std::atomic<uint64_t>> counter_;
};

// Sets environment variables for one scope and re-reads the configuration.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> values) {
    for (auto& [k, v] : values) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k.c_str(), v.c_str(), 1);
    }
    reloadConfig();
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
    reloadConfig();
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

using RankBody = std::function<void(Communicator& comm)>;
using TransportFactory = std::function<std::unique_ptr<Transport>()>;

// Runs body on one thread per engine, rank r on engines[r], in a new group of them all, made
// through `store` (null: a MemoryStore of its own); rethrows the first failure.
inline void runGroup(const std::vector<std::unique_ptr<Engine>>& engines, const RankBody& body,
                     std::chrono::milliseconds timeout, const Topology* simulated = nullptr,
                     std::shared_ptr<KeyValueStore> store = nullptr) {
  const int size = static_cast<int>(engines.size());
  if (!store) store = std::make_shared<MemoryStore>();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = Communicator::create(*engines[r], store, r, size, timeout, simulated);
        body(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Runs body on `size` rank threads, each with its own engine over a transport from `factory`
// (default: the loopback); rethrows the first failure.
inline void runRanks(int size, const RankBody& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60),
                     TransportFactory factory = nullptr) {
  LoopbackFabric fabric;
  if (!factory) factory = [&] { return fabric.join(); };
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < size; ++r) engines.push_back(std::make_unique<Engine>(factory()));
  runGroup(engines, body, timeout);
}

// runRanks over the loopback for a group that believes it runs on `topology` (hosts, racks).
inline void runRanksOn(const Topology& topology, const RankBody& body,
                       std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < topology.size; ++r)
    engines.push_back(std::make_unique<Engine>(fabric.join()));
  runGroup(engines, body, timeout, &topology);
}

// Runs body(i) on one thread per i in [0, n), rethrowing the first failure (processes that call
// one thing at once without a group: reconfigure's, a derivation's).
inline void together(int n, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        body(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Waits and turns a failed Work into an exception.
inline void check(const std::shared_ptr<Work>& work) {
  work->wait();
  if (work->failed()) throw Error(work->error());
}

// An allreduce of ones over `comm`: what each element sums to (its size, where it works).
inline double allreduceOnes(Communicator& comm) {
  std::vector<double> v(257, 1.0);
  check(comm.allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kSum));
  return v.back();
}

// News from `from` that `gone` are gone, each counted gone by its witness, and it through the wire.
inline Notice newsOf(int from, std::vector<int> gone, std::vector<int> witnesses,
                     std::string text) {
  Notice n;
  n.type = Notice::Type::kNews;
  n.from = from;
  n.gone = std::move(gone);
  n.witnesses = std::move(witnesses);
  n.text = std::move(text);
  return n;
}
inline std::optional<Notice> throughTheWire(const Notice& n) {
  const std::string bytes = n.encode();
  return Notice::decode(bytes.data(), bytes.size());
}

// Sends `bytes` as they are to `peer` under `slot`: a rank that speaks wrong bytes.
inline Task sendRaw(Op& op, int peer, uint64_t slot, std::string bytes) {
  co_await op.all(op.send(peer, slot, bytes.data(), bytes.size()));
}

}  // namespace ddl::test
