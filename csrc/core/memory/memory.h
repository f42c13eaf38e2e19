// Memory kinds: where a buffer lives (host memory, a CUDA device), and the few operations an
// algorithm needs on buffers of that kind: scratch, a local copy, an element-wise reduction and
// the last step of AVG. Algorithms call these through their Op and never call a device API
// themselves; the transport moves bytes of any kind it supports.
//
// Host memory is always available. A device kind is provided by a module compiled only when its
// toolkit is (csrc/cuda/), which registers it when the library loads; asking for a kind nobody
// registered is an Error that says so.
//
// Every operation is complete when it returns (a device kind synchronises its own stream), so an
// algorithm may post a send of what it just reduced or copied.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "../base/types.h"

namespace ddl {

enum class MemoryKind : uint8_t { kHost, kCuda };

const char* memoryKindName(MemoryKind kind);

class Memory {
 public:
  virtual ~Memory() = default;
  virtual MemoryKind kind() const = 0;
  // Prepares the calling thread (the progress thread, before it resumes an op on this memory)
  // for the transport to move such bytes: a device kind makes its device current.
  virtual void activate() {}
  // Scratch of at least `bytes` (one byte when 0), freed with the last copy of the pointer.
  virtual std::shared_ptr<char> allocate(size_t bytes) = 0;
  // memmove semantics.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst[i] = dst[i] (op) src[i] for i in [0, count), or src[i] (op) dst[i] (Operands); AVG
  // accumulates as SUM (see average()).
  virtual void reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                      Operands order) = 0;
  // The last step of AVG: buf[i] /= divisor (integers truncate toward zero).
  virtual void average(DataType type, void* buf, size_t count, size_t divisor) = 0;
  // False for a simulation's memory that only counts the time its operations would take: then
  // nothing may read or write the bytes behind its pointers except through this interface.
  virtual bool holdsBytes() const { return true; }
};

// What a device module implements for its kind: the Memory of device `device`.
using MemoryFactory = Memory* (*)(int device);
void registerMemory(MemoryKind kind, MemoryFactory factory);
bool memoryAvailable(MemoryKind kind);

// The Memory of `kind` on `device` (ignored for host memory); throws Error when this build has
// no support for `kind`.
Memory& memoryFor(MemoryKind kind, int device = 0);

}  // namespace ddl
