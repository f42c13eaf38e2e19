#include "log.h"

#include <unistd.h>

#include <cstdio>
#include <mutex>

namespace ddl {
namespace {

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// TORCH_DDL_DEBUG_FILE with %h and %p replaced.
std::string pathFor(const std::string& pattern) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      path += hostName();
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      path += std::to_string(getpid());
      ++i;
    } else {
      path += pattern[i];
    }
  }
  return path;
}

}  // namespace

void logLine(LogLevel level, const std::string& text) {
  static std::mutex mutex;
  static FILE* sink = nullptr;
  static std::string openedFor;
  static const char* const kNames[] = {"", "WARN", "INFO", "TRACE"};
  std::lock_guard<std::mutex> lock(mutex);
  const std::string& pattern = config().debugFile;
  if (sink == nullptr || openedFor != pattern) {
    if (sink != nullptr && sink != stderr) std::fclose(sink);
    sink = pattern.empty() ? stderr : std::fopen(pathFor(pattern).c_str(), "a");
    if (sink == nullptr) sink = stderr;  // the log must not fail the job
    openedFor = pattern;
  }
  std::fprintf(sink, "ddl %s:%d %s %s\n", hostName().c_str(), static_cast<int>(getpid()),
               kNames[static_cast<int>(level)], text.c_str());
  std::fflush(sink);
}

}  // namespace ddl
