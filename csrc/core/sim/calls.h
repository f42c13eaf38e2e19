// One collective as every member of a simulated group calls it: inputs drawn from a seed, the
// call each member makes, and each member's result checked against the reference computed
// here. Float32 data whose elements are small integers, exact whatever the order of a sum.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../group/communicator.h"

namespace ddl {

struct SimCall {
  // allreduce, broadcast, allgather, reduce_scatter, reduce, gather, scatter, alltoall, barrier,
  // and sendrecv (point to point: each rank sends to the next and receives from the previous)
  std::string collective = "allreduce";
  size_t count = 0;  // float32 elements (per rank and block where each rank has blocks)
  int root = 0;
  uint64_t seed = 1;
  DataType type = DataType::kFloat32;  // what the call says (the bytes are float32's)
  std::string describe() const;        // "allreduce of 1024 floats"
  // The bytes payload holds for it in a group of `size`: every rank's input (or output, the
  // larger), size x count floats, times size where a rank's input or output is a block per rank.
  uint64_t payloadBytes(int size) const;
};

// The collectives SimCall knows.
const std::vector<std::string>& simCollectives();

// The call a rank makes instead of `call` where it disagrees `how` (collective, size, dtype,
// root) in a group of `ranks`.
SimCall disagreeingCall(const SimCall& call, const std::string& how, int ranks);

class SimCallBuffers {
 public:
  // The buffers of a group of `size` ranks (with payload; without, addresses nothing may touch).
  SimCallBuffers(const SimCall& call, int size, bool payload);
  // What rank `rank` (of the group) calls on `comm`: this call, or `other` where that rank's
  // call differs (a rank that disagrees; its result is not checked).
  std::shared_ptr<Work> start(Communicator& comm, CallOptions options,
                              const SimCall* other = nullptr);
  // The first wrong element of `rank`'s result, "" when it is right (or nothing was carried).
  std::string check(int rank) const;

 private:
  size_t blocksIn() const;
  size_t blocksOut() const;
  float input(int rank, size_t i) const;

  SimCall call_;
  int size_;
  bool payload_;
  std::vector<std::vector<float>> in_, out_;  // by rank
  mutable std::vector<float> sums_;           // the reference sums, made on the first check
};

}  // namespace ddl
