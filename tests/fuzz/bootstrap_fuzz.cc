// Creation's cards and directory (group/bootstrap.h), from a child or the parent in the tree.
#include "../../csrc/core/group/bootstrap.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(bootstrap) {
  using namespace ddl;
  if (size == 0) return 0;
  const std::string input = fuzz::bytes(data + 1, size - 1);
  if (data[0] & 1) {
    GroupDirectory d;
    const int ranks = 1 + data[0] / 2;
    if (decodeDirectory(input, ranks, &d)) {
      DDL_FUZZ_CHECK(d.addresses.size() == static_cast<size_t>(ranks));
      for (const Level& level : d.topology.levels) {
        DDL_FUZZ_CHECK(level.ranks() == ranks);
        DDL_FUZZ_CHECK(level.blockNames.size() == static_cast<size_t>(level.blocks()));
        for (int r = 0; r < ranks; ++r) {
          const int block = level.blockOf(r);
          DDL_FUZZ_CHECK(block >= 0 && block < level.blocks());
        }
      }
      GroupDirectory again;
      DDL_FUZZ_CHECK(decodeDirectory(encodeDirectory(d), ranks, &again));
    }
    return 0;
  }
  std::vector<RankCard> cards;
  if (!decodeCards(input, &cards)) return 0;
  std::vector<RankCard> again;
  DDL_FUZZ_CHECK(decodeCards(encodeCards(cards), &again) && again.size() == cards.size());
  // Rank 0's decision from cards a child sent: localities and ranks as they came.
  if (cards.size() <= 64) {
    try {
      (void)directoryFrom(cards, RackMap{}, 3);
    } catch (const Error&) {  // a malformed locality: the creation fails with it
    }
  }
  return 0;
}
