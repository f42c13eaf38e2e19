// Creation's messages (group/bootstrap.h): a neighbour's card, a finger's address or a host's
// identities, a child's summary of its ranks, the parent's machine. The first byte says which
// (its low two bits) and for how many ranks (the rest).
#include "../../csrc/core/group/bootstrap.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(bootstrap) {
  using namespace ddl;
  if (size == 0) return 0;
  const std::string input = fuzz::bytes(data + 1, size - 1);
  const int ranks = 1 + data[0] / 4;
  switch (data[0] % 4) {
    case 0: {
      std::vector<RankCard> cards;
      if (!decodeCards(input, &cards)) return 0;
      std::vector<RankCard> again;
      DDL_FUZZ_CHECK(decodeCards(encodeCards(cards), &again) && again.size() == cards.size());
      // A directory from cards as they came (torch's reconfigure): localities and ranks.
      if (cards.size() <= 64) {
        try {
          (void)directoryFrom(cards, RackMap{}, 3);
        } catch (const Error&) {  // a malformed locality: the creation fails with it
        }
      }
      return 0;
    }
    case 1: {
      Bootstrapped m;
      if (!decodeMachine(input, ranks, &m)) return 0;
      if (m.error.ok()) {
        DDL_FUZZ_CHECK(m.topology.size == ranks && !m.topology.levels.empty());
        for (const Level& level : m.topology.levels) {
          DDL_FUZZ_CHECK(level.ranks() == ranks);
          for (int r = 0; r < ranks; ++r) {
            const int block = level.blockOf(r);
            DDL_FUZZ_CHECK(block >= 0 && block < level.blocks());
          }
        }
      }
      Bootstrapped again;
      DDL_FUZZ_CHECK(decodeMachine(encodeMachine(m), ranks, &again));
      return 0;
    }
    case 2: {
      Span s;
      if (!decodeSpan(input, ranks, &s)) return 0;
      DDL_FUZZ_CHECK(s.first >= 0 && s.count >= 1 && s.first + s.count <= ranks);
      Span again;
      DDL_FUZZ_CHECK(decodeSpan(encodeSpan(s), ranks, &again) && again.count == s.count);
      // The root's decision from it, where it covers the group.
      if (s.first == 0 && s.count == ranks) (void)machineFrom(s, ranks, 3, {});
      return 0;
    }
    default: {
      std::vector<std::pair<int, std::string>> entries;
      if (!decodeEntries(input, ranks, &entries)) return 0;
      for (const auto& [rank, text] : entries) DDL_FUZZ_CHECK(rank >= 0 && rank < ranks);
      std::vector<std::pair<int, std::string>> again;
      DDL_FUZZ_CHECK(decodeEntries(encodeEntries(entries), ranks, &again) && again == entries);
      return 0;
    }
  }
}
