#include "simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <regex>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {
namespace {

double micros(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// Rank r's element i for `seed`: small integers, exact in float32 whatever the order of the sum.
float valueOf(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
               i * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x % 8);
}

struct Buffers {
  std::vector<std::vector<float>> in, out;  // by rank (payload only)
};

class Runner {
 public:
  Runner(const SimRequest& request) : request_(request), cluster_(request.cluster) {
    count_ = request.bytes / sizeof(float);
    payload_ = request.cluster.payload;
  }
  SimCluster& cluster() { return cluster_; }
  size_t count() const { return count_; }

  void fill() {
    if (!payload_) return;
    const int n = cluster_.size();
    const size_t blocks = blocksIn();
    buffers_.in.assign(n, {});
    buffers_.out.assign(n, {});
    for (int r = 0; r < n; ++r) {
      buffers_.in[r].resize(count_ * blocks);
      for (size_t i = 0; i < buffers_.in[r].size(); ++i) {
        buffers_.in[r][i] = valueOf(request_.seed, r, i);
      }
      buffers_.out[r].assign(count_ * blocksOut(), -1.0f);
    }
  }

  SimCluster::Outcome run(std::chrono::milliseconds limit) {
    const std::string& c = request_.collective;
    return cluster_.run(
        [&](int r, Communicator& comm, CallOptions options) -> std::shared_ptr<Work> {
          void* in =
              payload_ ? static_cast<void*>(buffers_.in[r].data()) : SimMemory::placeholder(0);
          void* out =
              payload_ ? static_cast<void*>(buffers_.out[r].data()) : SimMemory::placeholder(0);
          const DataType f = DataType::kFloat32;
          if (c == "allreduce") return comm.allreduce(in, count_, f, ReduceOp::kSum, options);
          if (c == "broadcast") return comm.broadcast(in, count_, f, 0, options);
          if (c == "allgather") return comm.allgather(in, out, count_, f, options);
          if (c == "reduce_scatter") {
            return comm.reduceScatter(in, count_, f, ReduceOp::kSum, options);
          }
          if (c == "reduce") return comm.reduce(in, out, count_, f, ReduceOp::kSum, 0, options);
          if (c == "gather") return comm.gather(in, out, count_, f, 0, options);
          if (c == "scatter") return comm.scatter(in, out, count_, f, 0, options);
          if (c == "barrier") return comm.barrier(options);
          if (c == "alltoall") {
            AlltoallLayout layout;
            const size_t block = count_ * sizeof(float);
            for (int q = 0; q < comm.size(); ++q) {
              layout.sendOffsets.push_back(q * block);
              layout.sendBytes.push_back(block);
              layout.recvOffsets.push_back(q * block);
              layout.recvBytes.push_back(block);
            }
            return comm.alltoall(in, out, layout, options);
          }
          throw Error("ddl: the simulator has no collective '" + c + "'");
        },
        limit);
  }

  // The first wrong element of any rank, or "".
  std::string check() const {
    const std::string& c = request_.collective;
    const int n = cluster_.size();
    const size_t k = count_;
    auto in = [&](int r, size_t i) { return valueOf(request_.seed, r, i); };
    auto sum = [&](size_t i) {
      float s = 0;
      for (int q = 0; q < n; ++q) s += in(q, i);
      return s;
    };
    auto wrong = [](int r, size_t i, float got, float want) {
      return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
             std::to_string(got) + " where " + std::to_string(want) + " is right";
    };
    std::vector<float> sums;
    if (c == "allreduce" || c == "reduce" || c == "reduce_scatter") {
      const size_t total = c == "reduce_scatter" ? k * n : k;
      sums.resize(total);
      for (size_t i = 0; i < total; ++i) sums[i] = sum(i);
    }
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < k; ++i) {
        float got = 0, want = 0;
        if (c == "allreduce") {
          got = buffers_.in[r][i], want = sums[i];
        } else if (c == "broadcast") {
          got = buffers_.in[r][i], want = in(0, i);
        } else if (c == "reduce_scatter") {
          got = buffers_.in[r][r * k + i], want = sums[r * k + i];
        } else if (c == "reduce") {
          if (r != 0) break;
          got = buffers_.out[r][i], want = sums[i];
        } else if (c == "scatter") {
          got = buffers_.out[r][i], want = in(0, r * k + i);
        } else if (c == "allgather" || c == "gather" || c == "alltoall") {
          if (c == "gather" && r != 0) break;
          for (int q = 0; q < n; ++q) {
            const float g = buffers_.out[r][q * k + i];
            const float w = c == "alltoall" ? in(q, r * k + i) : in(q, i);
            if (g != w) return wrong(r, q * k + i, g, w);
          }
          continue;
        } else {
          break;
        }
        if (got != want) return wrong(r, i, got, want);
      }
    }
    return "";
  }

 private:
  size_t blocksIn() const {
    const std::string& c = request_.collective;
    const size_t n = static_cast<size_t>(cluster_.size());
    return c == "reduce_scatter" || c == "scatter" || c == "alltoall" ? n : 1;
  }
  size_t blocksOut() const {
    const std::string& c = request_.collective;
    const size_t n = static_cast<size_t>(cluster_.size());
    return c == "allgather" || c == "gather" || c == "alltoall" ? n : 1;
  }

  const SimRequest& request_;
  SimCluster cluster_;
  size_t count_ = 0;
  bool payload_ = true;
  Buffers buffers_;
};

double spanMicros(const SimCluster::Outcome& outcome) {
  double longest = 0;
  for (const auto& ended : outcome.ended) {
    if (ended) longest = std::max(longest, micros(outcome.began, *ended));
  }
  return longest;
}

}  // namespace

SimReport simulate(const SimRequest& request) {
  const auto wallStart = std::chrono::steady_clock::now();
  SimReport report;
  report.bytes = request.bytes;
  const std::chrono::milliseconds limit = request.cluster.timeout * 2;
  double faultFree = 0;
  {
    Runner runner(request);
    SimCluster& cluster = runner.cluster();
    report.ranks = cluster.size();
    const TimePoint created = cluster.network().now();
    cluster.createGroup();
    report.creationMicros = micros(created, cluster.network().now());
    report.storeRequests = cluster.storeRequests();
    report.creationMessages = cluster.network().messages();
    if (request.collective == "allreduce") {
      auto plan = cluster.comm(0).allreducePlan(runner.count(), DataType::kFloat32);
      report.algorithm = plan->describe();
      report.modelMicros = plan->predicted * 1e6;
    } else {
      report.algorithm = request.collective;
    }
    runner.fill();
    double before[3];
    for (int level = 0; level < 3; ++level) before[level] = cluster.network().busiestLink(level);
    SimCluster::Outcome outcome = runner.run(limit);
    if (!outcome.finished) throw Error("ddl: the simulated " + request.collective + " did not end");
    for (int r = 0; r < cluster.size(); ++r) {
      if (!outcome.errors[r].empty()) throw Error(outcome.errors[r]);
    }
    faultFree = spanMicros(outcome);
    report.simMicros = faultFree;
    for (int level = 0; level < 3; ++level) {
      const double busy = cluster.network().busiestLink(level) - before[level];
      report.busiest[level] = faultFree > 0 ? busy * 1e6 / faultFree : 0;
    }
    report.maxEndpoints = cluster.maxEndpoints();
    report.messages = cluster.network().messages();
    report.events = cluster.network().events();
    report.digest = cluster.network().digest();
    if (request.cluster.payload) {
      report.checked = true;
      report.mismatch = runner.check();
    }
  }
  if (request.killRank >= 0) {
    Runner runner(request);
    SimCluster& cluster = runner.cluster();
    if (request.killRank >= cluster.size()) {
      throw Error("ddl: cannot kill rank " + std::to_string(request.killRank) + " of " +
                  std::to_string(cluster.size()));
    }
    cluster.createGroup();
    runner.fill();
    const uint64_t noticeSlot = tag::slot(tag::kControlPhase, tag::kNoticeStep);
    const uint64_t noticesBefore = cluster.network().messagesOfSlot(noticeSlot);
    const TimePoint began = cluster.network().now();
    const auto at = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::micro>(faultFree * request.killFraction));
    cluster.network().kill(request.killRank, began + at);
    report.killedAtMicros = std::chrono::duration<double, std::micro>(at).count();
    SimCluster::Outcome outcome = runner.run(limit);
    // A survivor whose part was done before the failure reached it (its result is right: the
    // dead rank's data was in) raises at its next call: the group has failed. Each makes one.
    std::vector<int> finished;
    for (int r = 0; r < cluster.size(); ++r) {
      if (r != request.killRank && outcome.ended[r] && outcome.errors[r].empty()) {
        finished.push_back(r);
      }
    }
    report.completed = static_cast<int>(finished.size());
    if (!finished.empty()) {
      SimCluster::Outcome next = cluster.run(
          [&](int r, Communicator& comm, CallOptions options) -> std::shared_ptr<Work> {
            if (std::find(finished.begin(), finished.end(), r) == finished.end()) return nullptr;
            return comm.barrier(options);
          },
          limit);
      for (int r : finished) {
        outcome.errors[r] = next.errors[r];
        outcome.ended[r] = next.ended[r];
      }
    }
    const std::regex names("rank " + std::to_string(request.killRank) + "\\b");
    for (int r = 0; r < cluster.size(); ++r) {
      if (r == request.killRank) continue;
      ++report.survivors;
      const std::string& error = outcome.errors[r];
      if (error.empty() || !std::regex_search(error, names)) {
        if (report.unnamedError.empty()) {
          report.unnamedError =
              "rank " + std::to_string(r) + ": " + (error.empty() ? "no error" : error);
        }
        continue;
      }
      ++report.named;
      if (report.firstError.empty()) report.firstError = error;
      if (outcome.ended[r]) {
        report.namedByMicros = std::max(report.namedByMicros, micros(began, *outcome.ended[r]));
      }
    }
    report.failureMessages = cluster.network().messagesOfSlot(noticeSlot) - noticesBefore;
    report.killDigest = cluster.network().digest();
  }
  report.wallSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart).count();
  return report;
}

}  // namespace ddl
