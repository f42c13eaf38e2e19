// A notice (group/notices.h), from any rank of a group.
#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/group/notices.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(notice) {
  using namespace ddl;
  std::optional<Notice> n = Notice::decode(reinterpret_cast<const char*>(data), size);
  if (!n) return 0;
  DDL_FUZZ_CHECK(n->gone.size() <= tag::kMaxRanks);
  for (size_t i = 1; i < n->gone.size(); ++i) DDL_FUZZ_CHECK(n->gone[i - 1] < n->gone[i]);
  DDL_FUZZ_CHECK(n->witnesses.size() <= n->gone.size());
  for (int w : n->witnesses) DDL_FUZZ_CHECK(w >= 0 && w < static_cast<int>(tag::kMaxRanks));
  const std::string bytes = n->encode();
  DDL_FUZZ_CHECK(bytes.size() <= Notice::kMaxBytes);
  std::optional<Notice> again = Notice::decode(bytes.data(), bytes.size());
  DDL_FUZZ_CHECK(again && again->sequence == n->sequence && again->from == n->from &&
                 again->incarnation == n->incarnation);
  return 0;
}
