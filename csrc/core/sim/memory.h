// Host memory as a simulated rank sees it: every copy and reduction costs the rank virtual time
// (bytes over the configured bandwidth: SimNetwork::charge), and with payload off nothing is
// stored at all: scratch and buffers are addresses in a reserved range that nothing may touch
// (PROT_NONE, so a stray access faults at once instead of passing unseen), and copies and
// reductions only count their time. Algorithms reach bytes only through Memory over message
// links (the simulated transport offers shared windows only with the payload on, for the whole
// run: SimNetworkSpec::windows), which makes that safe.
#pragma once

#include "../memory/memory.h"
#include "network.h"

namespace ddl {

class SimMemory : public Memory {
 public:
  SimMemory(SimNetwork& network, bool payload, double reduceBandwidth, double copyBandwidth);
  MemoryKind kind() const override { return MemoryKind::kHost; }
  std::shared_ptr<char> allocate(size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
              Operands order) override;
  void average(DataType type, void* buf, size_t count, size_t divisor) override;
  bool holdsBytes() const override { return payload_; }
  // Payload on or off from now on (between ops: what an op allocated keeps its kind).
  void carryPayload(bool on) { payload_ = on; }

  // The start of an address range of `bytes` that nothing may read or write (payload off).
  static char* placeholder(size_t bytes);

 private:
  SimNetwork& network_;
  Memory& host_;
  bool payload_;
  double reduceBandwidth_;
  double copyBandwidth_;
};

}  // namespace ddl
