// An agreement's cards (group/agreement.h), from a member below in the tree.
#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/group/agreement.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(agreement) {
  using namespace ddl;
  std::vector<DeriveCard> cards;
  if (!decodeCards(fuzz::bytes(data, size), 1 << 16, &cards)) return 0;
  for (const DeriveCard& c : cards) {
    DDL_FUZZ_CHECK(c.heldIds.size() <= tag::kMaxGroups);
    DDL_FUZZ_CHECK(c.rank >= 0 && c.parentRank >= 0);
  }
  std::vector<DeriveCard> again;
  DDL_FUZZ_CHECK(decodeCards(encodeCards(cards), 1 << 16, &again) && again.size() == cards.size());
  if (!cards.empty() && cards.size() <= 64) {
    const DeriveResult r = decideDerived(cards, "shrink_group");
    DDL_FUZZ_CHECK(!r.error.ok() || r.id < tag::kGroupIds);
  }
  return 0;
}
