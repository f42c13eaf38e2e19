// A running process's state as `python -m torch_ddl.status` asks for it (docs/status.md): the ops
// in flight, whom each still awaits and how long ago those peers' heartbeats arrived, the peers
// found gone, and what the runtime counted of the ops it ended (stats.h). Reading it changes
// nothing: the ops are looked at on the turning thread, between turns.
#pragma once

#include <chrono>
#include <string>

namespace ddl {

class Runtime;

// The ops in flight and the peers found gone, as JSON members ("ops": [...], "lost": [...]).
// Turning thread.
std::string inFlightJson(Runtime& runtime);

// The whole of it as one JSON object. Any thread but the turning one: the ops in flight are
// asked of the turning thread, which has `wait` to answer; a runtime that does not (busy in a
// long reduction, or stopped) is said so ("in_flight": "no answer ..."), and the counts come
// all the same.
std::string statusJson(Runtime& runtime, std::chrono::milliseconds wait);

}  // namespace ddl
