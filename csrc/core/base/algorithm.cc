#include "algorithm.h"

namespace ddl {
namespace {

struct Named {
  AllreduceAlgorithm algorithm;
  const char* name;
};
constexpr Named kNames[] = {
    {AllreduceAlgorithm::kAuto, "auto"},
    {AllreduceAlgorithm::kTrivial, "trivial"},
    {AllreduceAlgorithm::kRecursiveDoubling, "recursive_doubling"},
    {AllreduceAlgorithm::kLeaders, "leaders"},
    {AllreduceAlgorithm::kRing, "ring"},
    {AllreduceAlgorithm::kMultiDim, "multidim"},
    {AllreduceAlgorithm::kShared, "shared"},
    {AllreduceAlgorithm::kSharedRing, "shm_ring"},
    {AllreduceAlgorithm::kDirect, "direct"},
    {AllreduceAlgorithm::kStaged, "staged"},
};

}  // namespace

const char* algorithmName(AllreduceAlgorithm algorithm) {
  for (const Named& n : kNames) {
    if (n.algorithm == algorithm) return n.name;
  }
  return "?";
}

std::optional<AllreduceAlgorithm> algorithmNamed(const std::string& name) {
  for (const Named& n : kNames) {
    if (name == n.name) return n.algorithm;
  }
  return std::nullopt;
}

}  // namespace ddl
