#include "memory.h"

#include <sys/mman.h>

#include <mutex>

#include "../base/types.h"

namespace ddl {
namespace {

constexpr size_t kReserved = size_t{1} << 40;  // 1 TiB of address space, no memory

}  // namespace

SimMemory::SimMemory(SimNetwork& network, bool payload, double reduceBandwidth,
                     double copyBandwidth)
    : network_(network),
      host_(memoryFor(MemoryKind::kHost)),
      payload_(payload),
      reduceBandwidth_(reduceBandwidth),
      copyBandwidth_(copyBandwidth) {}

char* SimMemory::placeholder(size_t bytes) {
  static char* base = [] {
    void* p =
        mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw Error("ddl: the simulator could not reserve address space");
    return static_cast<char*>(p);
  }();
  if (bytes > kReserved) throw Error("ddl: a simulated buffer of more than 1 TiB");
  return base;
}

std::shared_ptr<char> SimMemory::allocate(size_t bytes) {
  if (payload_) return host_.allocate(bytes);
  return std::shared_ptr<char>(placeholder(bytes), [](char*) {});
}

void SimMemory::copy(void* dst, const void* src, size_t bytes) {
  if (copyBandwidth_ > 0) network_.chargeReduction(static_cast<double>(bytes) / copyBandwidth_);
  if (payload_) host_.copy(dst, src, bytes);
}

void SimMemory::reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                       Operands order) {
  if (reduceBandwidth_ > 0) {
    network_.chargeReduction(static_cast<double>(count * elementSize(type)) / reduceBandwidth_);
  }
  if (payload_) host_.reduce(type, op, dst, src, count, order);
}

void SimMemory::average(DataType type, void* buf, size_t count, size_t divisor) {
  if (reduceBandwidth_ > 0) {
    network_.chargeReduction(static_cast<double>(count * elementSize(type)) / reduceBandwidth_);
  }
  if (payload_) host_.average(type, buf, count, divisor);
}

}  // namespace ddl
