// Reconfigure handles (Derivation::handle), passed around out of band, and the locality and
// process identity they carry (also in creation's cards).
#include "../../csrc/core/group/communicator.h"
#include "../../csrc/core/runtime/liveness.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(handle) {
  using namespace ddl;
  const std::string text = fuzz::bytes(data, size);
  // A malformed record is an Error (its callers fail the op that read it), never a crash.
  try {
    const Locality where = Locality::decode(text);
    DDL_FUZZ_CHECK(Locality::decode(where.encode()).sameHost(where));
  } catch (const Error&) {
  }
  try {
    (void)ProcessIdentity::decode(text);
  } catch (const Error&) {
  }
  try {
    const std::vector<std::string> ordered = Derivation::orderHandles({text, "ddl1:" + text});
    DDL_FUZZ_CHECK(ordered.size() == 2);
  } catch (const Error&) {
  }
  return 0;
}
