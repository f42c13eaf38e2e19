// What the collective tests share: a failed element described, and a buffer from the engine's
// shared buffers (what torch_ddl.empty_shared hands out).
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

namespace ddl::test {

inline std::string describe(const std::string& what, int size, int rank, DataType t, ReduceOp op,
                            size_t count, size_t i, double got, double want) {
  std::ostringstream s;
  s << what << " size=" << size << " rank=" << rank << " dtype=" << dataTypeName(t)
    << " op=" << reduceOpName(op) << " count=" << count << " element " << i << ": got " << got
    << ", want " << want;
  return s.str();
}

// Allreduces (MAX, then MIN) `count` floats whose result depends on the order of the operands
// (MAX of NaN and 1 is NaN one way and 1 the other; of -0.0 and +0.0, the first), and keeps what
// this rank ends with in results[rank]: every rank must end with the same bits.
inline void reduceOrderSensitive(Communicator& comm, size_t count,
                                 std::vector<std::vector<float>>& results) {
  const float kinds[] = {std::nanf(""), 1.0f, -0.0f, 0.0f};
  std::vector<float> ends;
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = kinds[(i + comm.rank()) % 4];
    check(comm.allreduce(buf.data(), count, DataType::kFloat32, op));
    ends.insert(ends.end(), buf.begin(), buf.end());
  }
  results[comm.rank()] = ends;
}

// The first rank whose results differ from rank 0's in any bit, with where; empty if none.
inline std::string firstDifference(const std::vector<std::vector<float>>& results) {
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < results[r].size(); ++i) {
      if (std::memcmp(&results[r][i], &results[0][i], sizeof(float)) != 0) {
        std::ostringstream s;
        s << "rank " << r << " holds " << results[r][i] << " at " << i << ", rank 0 "
          << results[0][i];
        return s.str();
      }
    }
  }
  return "";
}

// A buffer from the engine's shared buffers (what torch_ddl.empty_shared hands out).
class SharedBuffer {
 public:
  SharedBuffer(Engine& engine, size_t bytes)
      : buffers_(engine.sharedBuffers()), base_(static_cast<char*>(buffers_->allocate(bytes))) {}
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer() { buffers_->release(base_); }
  char* data() const { return base_; }

 private:
  std::shared_ptr<SharedBuffers> buffers_;
  char* base_;
};

}  // namespace ddl::test
