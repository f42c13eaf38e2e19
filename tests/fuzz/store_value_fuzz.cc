// A group id as the store holds it (group/creation.h: parseGroupId).
#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/group/communicator.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(store_value) {
  using namespace ddl;
  try {
    const uint32_t id = parseGroupId(fuzz::bytes(data, size), "ddl/0/group_id");
    DDL_FUZZ_CHECK(id < tag::kGroupIds);
    DDL_FUZZ_CHECK(parseGroupId(std::to_string(id), "k") == id);
  } catch (const Error& e) {
    DDL_FUZZ_CHECK(e.kind() == StatusKind::kInvalidArgument);
  }
  return 0;
}
