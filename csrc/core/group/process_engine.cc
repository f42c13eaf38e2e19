// The process-wide engine over UCX, shared by every process group of the process.
#include <mutex>

#include "../transport/ucx/ucx_transport.h"
#include "engine.h"

namespace ddl {
namespace {
std::mutex gProcessMutex;
Engine* gProcessEngine = nullptr;
}  // namespace

Engine& Engine::process() {
  std::lock_guard<std::mutex> lock(gProcessMutex);
  if (gProcessEngine == nullptr) gProcessEngine = new Engine(std::make_unique<UcxTransport>());
  return *gProcessEngine;
}

void Engine::shutdownProcess() {
  std::lock_guard<std::mutex> lock(gProcessMutex);
  delete gProcessEngine;
  gProcessEngine = nullptr;
}

}  // namespace ddl
