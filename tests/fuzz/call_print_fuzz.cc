// A call print (runtime/call_print.h), from the previous rank of a collective.
#include <cstring>

#include "../../csrc/core/runtime/call_print.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(call_print) {
  using namespace ddl;
  if (size < sizeof(CallPrint)) return 0;
  CallPrint print;
  std::memcpy(&print, data, sizeof(print));
  (void)print.describe();
  DDL_FUZZ_CHECK(print == print);
  return 0;
}
