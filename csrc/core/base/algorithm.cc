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

std::vector<int> recursiveDoublingPartners(int position, int n) {
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  std::vector<int> partners;
  if (position < 2 * extra) partners.push_back(position ^ 1);
  const int v = position >= 2 * extra ? position - extra : position % 2 == 1 ? position / 2 : -1;
  for (int mask = 1; v >= 0 && mask < p2; mask <<= 1) {
    const int peer = v ^ mask;
    partners.push_back(peer < extra ? peer * 2 + 1 : peer + extra);
  }
  return partners;
}

}  // namespace ddl
