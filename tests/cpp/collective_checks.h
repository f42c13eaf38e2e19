// What the collective tests share: a failed element described, and a buffer from the engine's
// shared buffers (what torch_ddl.empty_shared hands out).
#pragma once

#include <memory>
#include <sstream>
#include <string>

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
