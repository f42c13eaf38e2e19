// Fuzz targets: one per decoder of bytes from a peer or the store (docs/testing.md). Each is a
// libFuzzer entry point in `make fuzz` (clang, -fsanitize=fuzzer,address,undefined), and a
// function that core_tests' Fuzz.CorporaReplay runs on every input kept under
// tests/fuzz/corpus/<target>/ (the corpus libFuzzer grew, and every input once found failing).
// A target returns normally for any input: what it decodes is either refused or checked to
// hold what it must (DDL_FUZZ_CHECK).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#ifdef DDL_LIBFUZZER
#define DDL_FUZZ_TARGET(name) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#define DDL_FUZZ_CHECK(condition)                                  \
  do {                                                             \
    if (!(condition)) {                                            \
      std::fprintf(stderr, "fuzz check failed: %s\n", #condition); \
      std::abort();                                                \
    }                                                              \
  } while (0)
#else
namespace ddl::fuzz {
using Target = int (*)(const uint8_t* data, size_t size);
bool add(const char* name, Target target);
}  // namespace ddl::fuzz
#define DDL_FUZZ_TARGET(name)                                                                   \
  static int fuzz_##name(const uint8_t* data, size_t size);                                     \
  [[maybe_unused]] static const bool registered_##name = ::ddl::fuzz::add(#name, &fuzz_##name); \
  static int fuzz_##name(const uint8_t* data, size_t size)
#define DDL_FUZZ_CHECK(condition)                                               \
  do {                                                                          \
    if (!(condition)) throw std::logic_error("fuzz check failed: " #condition); \
  } while (0)
#endif

namespace ddl::fuzz {
inline std::string bytes(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}
}  // namespace ddl::fuzz
