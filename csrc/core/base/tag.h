// The 64-bit tag layout shared by every message. Named widths keep concurrent groups, operations,
// rings and steps apart: two messages can only match when all four fields agree.
//
//   63          52 51             36 35                  16 15            0
//   | group (12)  | sequence (16)   | slot (20)            | source (16)   |
//
// group:    the communicator's id, agreed through the store when the group is created.
// sequence: the operation's number within its group, taken in program order.
// slot:     which message of the operation: phase (6 bits) and step (14 bits). Phases
//           0..kPlanPhases-1 are handed out by an operation's plan (one per ring x colour running
//           at once: topology/allreduce_plan.h); kControlPhase carries call prints, notices and
//           what an algorithm's messages say of their sizes;
//           kSharedPhase is the shared-memory ring's and the direct path's; kWindowPhase
//           carries the signals of one-sided windows; the top
//           kPointToPointPhases carry point-to-point tags. Messages of one
//           slot between one pair are matched in send order (FIFO), so segments of a pipelined
//           step share a slot.
// source:   the sender's rank in the group; a receive from any source masks it out.
//
// A group of more than 2^16 ranks (up to kMaxRanks, 2^20) is "wide": a rank's bits above the
// source field go into the group field, XORed into the low bits of the group's id. Such a group
// holds every id of the aligned block of 2^wideBits(size) ids its id lies in (group/engine.h),
// so what its ranks send carries ids no other group holds. A group of at most 2^16 ranks has no
// wide bits, and its tags are what they were before wide groups: for it every function below
// gives what the plain layout gives.
#pragma once

#include <cstdint>

namespace ddl::tag {

inline constexpr int kSourceBits = 16;
inline constexpr int kSlotBits = 20;
inline constexpr int kSequenceBits = 16;
inline constexpr int kGroupBits = 12;
static_assert(kSourceBits + kSlotBits + kSequenceBits + kGroupBits == 64);

inline constexpr int kSourceShift = 0;
inline constexpr int kSlotShift = kSourceShift + kSourceBits;
inline constexpr int kSequenceShift = kSlotShift + kSlotBits;
inline constexpr int kGroupShift = kSequenceShift + kSequenceBits;

inline constexpr int kStepBits = 14;
inline constexpr int kPhaseBits = kSlotBits - kStepBits;
inline constexpr uint32_t kMaxSteps = uint32_t{1} << kStepBits;
// Point-to-point messages use the top phases: their user tag (32 bits) fills the sequence field
// (low 16 bits) and the step and the low bits of the phase (high 16 bits).
inline constexpr uint32_t kPointToPointPhases = 4;
inline constexpr uint32_t kPointToPointPhase = (1u << kPhaseBits) - kPointToPointPhases;
static_assert((uint64_t{kPointToPointPhases} << kStepBits) >= (uint64_t{1} << 16));
// The shared-memory ring and the direct allreduce (one at a time per group).
inline constexpr uint32_t kSharedPhase = kPointToPointPhase - 1;
// Call checks (runtime/call_print.h) and notices (group/notices.h): step kPrintStep carries an op's
// call print to the next rank, step kNoticeStep a notice to every rank (received from any sequence
// and source).
inline constexpr uint32_t kControlPhase = kSharedPhase - 1;
inline constexpr uint32_t kPrintStep = 0;
inline constexpr uint32_t kNoticeStep = 1;
// Group creation's messages up and down its tree (group/bootstrap.h), under sequence 0.
inline constexpr uint32_t kBootstrapStep = 2;
// Signals of one-sided windows (group/window.h): under the agreements' group id (below) with
// the window's id in the sequence field, so that nothing a group discards (what a failed op left
// behind, matched by group and sequence) is a signal.
inline constexpr uint32_t kWindowPhase = kControlPhase - 1;
// Phases a plan may hand out to rings and colours in flight at once.
inline constexpr uint32_t kPlanPhases = kWindowPhase;

inline constexpr uint64_t field(uint64_t value, int bits, int shift) {
  return (value & ((uint64_t{1} << bits) - 1)) << shift;
}

inline constexpr uint64_t slot(uint32_t phase, uint32_t step) {
  return field(phase, kPhaseBits, kStepBits) | field(step, kStepBits, 0);
}

// Bits of a rank above the source field: up to kWideBits (groups of up to 2^20 ranks).
inline constexpr int kWideBits = 4;

// `source`'s bits above the source field go into the low bits of the group field (XOR).
inline constexpr uint64_t make(uint32_t group, uint32_t sequence, uint64_t slotValue,
                               uint32_t source) {
  return field(group ^ (source >> kSourceBits), kGroupBits, kGroupShift) |
         field(sequence, kSequenceBits, kSequenceShift) | field(slotValue, kSlotBits, kSlotShift) |
         field(source, kSourceBits, kSourceShift);
}

inline constexpr uint64_t kMatchAll = ~uint64_t{0};
inline constexpr uint64_t kAnySource = ~field(~uint64_t{0}, kSourceBits, kSourceShift);
// Matches group and slot only: any sequence, any source.
inline constexpr uint64_t kGroupAndSlot =
    field(~uint64_t{0}, kGroupBits, kGroupShift) | field(~uint64_t{0}, kSlotBits, kSlotShift);
// Matches group and sequence only: every message of one op.
inline constexpr uint64_t kGroupAndSequence = field(~uint64_t{0}, kGroupBits, kGroupShift) |
                                              field(~uint64_t{0}, kSequenceBits, kSequenceShift);

// The phases below the point-to-point ones (0 .. kPointToPointPhase - 1) as prefixes of the
// phase field: a tag matches (first, mask) when its phase is in the range. What a failed op left
// behind is discarded under these (a point-to-point message of the same sequence field is a
// user tag's, not the op's).
struct PhaseRange {
  uint32_t first;
  uint64_t mask;  // the phase bits that are fixed, in place in the tag
};
inline constexpr uint64_t phasePrefixMask(int fixedBits) {
  return field(((uint64_t{1} << fixedBits) - 1) << (kPhaseBits - fixedBits), kPhaseBits,
               kSlotShift + kStepBits);
}
inline constexpr PhaseRange kCollectivePhases[] = {
    {0, phasePrefixMask(1)},                       // 0 .. 31
    {1u << (kPhaseBits - 1), phasePrefixMask(2)},  // 32 .. 47
    {3u << (kPhaseBits - 2), phasePrefixMask(3)},  // 48 .. 55
    {7u << (kPhaseBits - 3), phasePrefixMask(4)},  // 56 .. 59
};
static_assert(kPhaseBits == 6 && kPointToPointPhase == (15u << (kPhaseBits - 4)),
              "kCollectivePhases covers the phases below the point-to-point ones");

// The rank of the sender of a message of the group of id `group`.
inline constexpr uint32_t source(uint64_t t, uint32_t group) {
  const uint64_t low = (t >> kSourceShift) & ((uint64_t{1} << kSourceBits) - 1);
  const uint64_t high = ((t >> kGroupShift) ^ group) & ((uint64_t{1} << kWideBits) - 1);
  return static_cast<uint32_t>(high << kSourceBits | low);
}

// The bits of a rank of a group of `size` ranks above the source field (0: not a wide group).
inline constexpr int wideBits(int64_t size) {
  int bits = 0;
  while ((int64_t{1} << (kSourceBits + bits)) < size) ++bits;
  return bits;
}

// The group field's bits that carry a wide group's ranks, in place in the tag.
inline constexpr uint64_t wideMask(int wide) {
  return field((uint64_t{1} << wide) - 1, kGroupBits, kGroupShift);
}
// The masks above for a group with `wide` bits (tag::wideBits): its ids' block matches.
inline constexpr uint64_t anySource(int wide) { return kAnySource & ~wideMask(wide); }
inline constexpr uint64_t groupAndSlot(int wide) { return kGroupAndSlot & ~wideMask(wide); }
inline constexpr uint64_t groupAndSequence(int wide) { return kGroupAndSequence & ~wideMask(wide); }

// A group holds up to 2^20 ranks: the source field and kWideBits more. A flat ring of P ranks
// takes 2(P-1) steps, more than a step field holds above 8 192 ranks: its steps wrap (tag::slot
// keeps the low kStepBits), so steps s and s + kMaxSteps share a slot. They cannot mix: a ring
// position sends its steps in order to one peer, which posts its receives in order and at most 64
// steps ahead of the first not wholly arrived (ring_pipeline.cc), and messages of one slot
// between one pair match in send order. Rings that share a rank within a lane (multidim and block
// plans) still take ranges of steps apart that fit the field (plan_check.cc).
inline constexpr uint32_t kMaxRanks = uint32_t{1} << (kSourceBits + kWideBits);
inline constexpr uint32_t kMaxGroups = uint32_t{1} << kGroupBits;
// Ids a group may hold: all but the last, which carries the agreements that make a group out of
// another one's ranks (shrink, split, reconfigure: group/agreement.h). A wide group's agreements
// (and its windows' signals) carry the ids of the top block with the last: a process that holds
// a wide group holds that block's ids too (group/engine.h), and a wide group's own block is
// another.
inline constexpr uint32_t kGroupIds = kMaxGroups - 1;
inline constexpr uint32_t kAgreementGroup = kMaxGroups - 1;
inline constexpr uint32_t kAgreementBlock = kMaxGroups - (uint32_t{1} << kWideBits);
// The id of the group made through the store with number `number` (the store's count of
// creations) and `wide` bits: a wide group's is the first of an aligned block below the
// agreements' one.
inline constexpr uint32_t groupIdOf(uint64_t number, int wide) {
  return wide == 0 ? static_cast<uint32_t>(number % kGroupIds)
                   : static_cast<uint32_t>(number % (kAgreementBlock >> wide)) << wide;
}
inline constexpr uint32_t kAgreementStep = 3;
// A member whose agreement failed tells its neighbours in the agreement's tree (group/agreement.h).
inline constexpr uint32_t kAgreementAbortStep = 4;
// The link probe at a group's creation (group/link_probe.h), under sequence 0: pings, data,
// acknowledgements, the host ring's token and steps, the figures up and down the tree.
inline constexpr uint32_t kProbeStep = 5;
inline constexpr uint32_t kProbeSteps = 6;
// Heartbeats (runtime/heartbeat.h), under the agreements' group id and sequence 0.
inline constexpr uint32_t kHeartbeatStep = kProbeStep + kProbeSteps;
// Bruck's all-to-all (algorithms/alltoall_bruck.cc): round k's block sizes at step kSizesStep + k,
// under the op's sequence (in the control phase, so that a simulation without payload carries
// them).
inline constexpr uint32_t kSizesStep = kHeartbeatStep + 1;
inline constexpr uint32_t kSizesSteps = 32;  // rounds: ceil(log2 P) <= 32
// Creation's last round up and down its tree (group/creation.cc), under sequence 0: no rank's
// creation ends before every rank has looked up the peers it meets.
inline constexpr uint32_t kReadyStep = kSizesStep + kSizesSteps;

}  // namespace ddl::tag
