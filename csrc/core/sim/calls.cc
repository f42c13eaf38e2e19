#include "calls.h"

#include "memory.h"

namespace ddl {
namespace {

// Rank r's element i for `seed`: small integers, exact in float32 whatever the order of the sum.
float valueOf(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
               i * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x % 8);
}

bool inputPerBlock(const std::string& c) {
  return c == "reduce_scatter" || c == "scatter" || c == "alltoall";
}

bool outputPerBlock(const std::string& c) {
  if (c == "sendrecv") return false;
  return c == "allgather" || c == "gather" || c == "alltoall";
}

}  // namespace

const std::vector<std::string>& simCollectives() {
  static const std::vector<std::string> names = {"allreduce",      "broadcast", "allgather",
                                                 "reduce_scatter", "reduce",    "gather",
                                                 "scatter",        "alltoall",  "barrier"};
  return names;
}

std::string SimCall::describe() const {
  if (collective == "barrier") return "barrier";
  std::string s = collective + " of " + std::to_string(count) + " floats";
  if (collective == "broadcast" || collective == "reduce" || collective == "gather" ||
      collective == "scatter") {
    s += " (root " + std::to_string(root) + ")";
  }
  return s;
}

uint64_t SimCall::payloadBytes(int size) const {
  const uint64_t n = static_cast<uint64_t>(size);
  const bool blocks = inputPerBlock(collective) || outputPerBlock(collective);
  return n * count * sizeof(float) * (blocks ? n : 1);
}

SimCallBuffers::SimCallBuffers(const SimCall& call, int size, bool payload)
    : call_(call), size_(size), payload_(payload) {
  if (!payload_) return;
  in_.assign(size, {});
  out_.assign(size, {});
  for (int r = 0; r < size; ++r) {
    in_[r].resize(call_.count * blocksIn());
    for (size_t i = 0; i < in_[r].size(); ++i) in_[r][i] = input(r, i);
    out_[r].assign(call_.count * blocksOut(), -1.0f);
  }
}

size_t SimCallBuffers::blocksIn() const {
  return inputPerBlock(call_.collective) ? static_cast<size_t>(size_) : 1;
}

size_t SimCallBuffers::blocksOut() const {
  return outputPerBlock(call_.collective) ? static_cast<size_t>(size_) : 1;
}

float SimCallBuffers::input(int rank, size_t i) const { return valueOf(call_.seed, rank, i); }

std::shared_ptr<Work> SimCallBuffers::start(Communicator& comm, CallOptions options,
                                            const SimCall* other) {
  const int r = comm.rank();
  const SimCall& call = other != nullptr ? *other : call_;
  // A call that differs gets buffers of its own size (its result is not checked).
  std::vector<float>* scratch = nullptr;
  if (other != nullptr && payload_) {
    auto held = std::make_shared<std::vector<std::vector<float>>>(
        2, std::vector<float>(std::max(call.count, call_.count) * (size_ + 1), 0.0f));
    options.work->retain(held);
    scratch = held->data();
  }
  void* in = scratch != nullptr ? static_cast<void*>(scratch[0].data())
             : payload_         ? static_cast<void*>(in_[r].data())
                                : SimMemory::placeholder(0);
  void* out = scratch != nullptr ? static_cast<void*>(scratch[1].data())
              : payload_         ? static_cast<void*>(out_[r].data())
                                 : SimMemory::placeholder(0);
  const DataType f = call.type;
  const std::string& c = call.collective;
  const size_t k = call.count;
  if (c == "sendrecv") {
    const int n = comm.size();
    if (n < 2) return comm.barrier(options);
    std::vector<Communicator::Transfer> transfers(2);
    transfers[0] = {true, in, k * sizeof(float), (r + 1) % n, 7};
    transfers[1] = {false, out, k * sizeof(float), (r + n - 1) % n, 7};
    return comm.pointToPoint(std::move(transfers), options);
  }
  if (c == "allreduce") {
    // About half the ranks' callers wait for it at once (torch's blocking call), as the call's
    // seed has it: a small allreduce of one host then takes the quick path where it may.
    options.waited = ((call.seed >> (comm.rank() % 61)) & 1) != 0;
    return comm.allreduce(in, k, f, ReduceOp::kSum, options);
  }
  if (c == "broadcast") return comm.broadcast(in, k, f, call.root, options);
  if (c == "allgather") return comm.allgather(in, out, k, f, options);
  if (c == "reduce_scatter") return comm.reduceScatter(in, k, f, ReduceOp::kSum, options);
  if (c == "reduce") return comm.reduce(in, out, k, f, ReduceOp::kSum, call.root, options);
  if (c == "gather") return comm.gather(in, out, k, f, call.root, options);
  if (c == "scatter") return comm.scatter(in, out, k, f, call.root, options);
  if (c == "barrier") return comm.barrier(options);
  if (c == "alltoall") {
    AlltoallLayout layout;
    const size_t block = k * sizeof(float);
    for (int q = 0; q < comm.size(); ++q) {
      layout.sendOffsets.push_back(q * block);
      layout.sendBytes.push_back(block);
      layout.recvOffsets.push_back(q * block);
      layout.recvBytes.push_back(block);
    }
    return comm.alltoall(in, out, layout, options);
  }
  throw Error("ddl: the simulator has no collective '" + c + "'", StatusKind::kInvalidArgument);
}

std::string SimCallBuffers::check(int r) const {
  if (!payload_) return "";
  // The inputs as they were (a rank's buffer may hold its result now).
  auto in0 = [this](int q, size_t i) { return input(q, i); };
  const std::string& c = call_.collective;
  const int n = size_;
  const size_t k = call_.count;
  if (sums_.empty() && (c == "allreduce" || c == "reduce" || c == "reduce_scatter")) {
    sums_.assign(c == "reduce_scatter" ? k * n : k, 0.0f);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += in0(q, i);
    }
  }
  auto sum = [&](size_t i) { return sums_[i]; };
  auto wrong = [r](size_t i, float got, float want) {
    return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
           std::to_string(got) + " where " + std::to_string(want) + " is right";
  };
  for (size_t i = 0; i < k; ++i) {
    float got = 0, want = 0;
    if (c == "sendrecv") {
      got = out_[r][i], want = input((r + n - 1) % n, i);
    } else if (c == "allreduce") {
      got = in_[r][i], want = sum(i);
    } else if (c == "broadcast") {
      got = in_[r][i], want = input(call_.root, i);
    } else if (c == "reduce_scatter") {
      got = in_[r][r * k + i], want = sum(r * k + i);
    } else if (c == "reduce") {
      if (r != call_.root) return "";
      got = out_[r][i], want = sum(i);
    } else if (c == "scatter") {
      got = out_[r][i], want = input(call_.root, r * k + i);
    } else if (c == "allgather" || c == "gather" || c == "alltoall") {
      if (c == "gather" && r != call_.root) return "";
      for (int q = 0; q < n; ++q) {
        const float g = out_[r][q * k + i];
        const float w = c == "alltoall" ? input(q, r * k + i) : input(q, i);
        if (g != w) return wrong(q * k + i, g, w);
      }
      continue;
    } else {
      return "";
    }
    if (got != want) return wrong(i, got, want);
  }
  return "";
}

// The call a disagreeing rank makes instead of `call`.
SimCall disagreeingCall(const SimCall& call, const std::string& how, int ranks) {
  SimCall other = call;
  if (how == "collective") {
    other.collective = call.collective == "allreduce" ? "broadcast" : "allreduce";
    if (call.collective == "barrier" || call.collective == "sendrecv") other.count = 3;
  } else if (how == "dtype" && call.collective != "barrier" && call.collective != "sendrecv" &&
             call.collective != "alltoall") {  // (those move bytes: no type to differ on)
    other.type = DataType::kInt32;
  } else if (how == "root" && (call.collective == "broadcast" || call.collective == "reduce" ||
                               call.collective == "gather" || call.collective == "scatter")) {
    other.root = (call.root + 1) % ranks;
  } else {
    other.count = call.count + 1;
  }
  return other;
}

}  // namespace ddl
