// The debug log (TORCH_DDL_DEBUG=WARN|INFO|TRACE, TORCH_DDL_DEBUG_FILE), as NCCL_DEBUG is for
// NCCL: WARN for every fallback, INFO for what each group found and chose, TRACE for each op.
// Call sites test logs(level) first and build their line only then: off, a log costs one load
// of the configuration and a branch.
#pragma once

#include <string>

#include "config.h"

namespace ddl {

enum class LogLevel { kWarn = 1, kInfo = 2, kTrace = 3 };

inline bool logs(LogLevel level) { return config().debug >= static_cast<int>(level); }

// One line, "ddl HOST:PID LEVEL text", to TORCH_DDL_DEBUG_FILE (opened once, appended to) or
// standard error. Thread-safe.
void logLine(LogLevel level, const std::string& text);

}  // namespace ddl
