// The status port of a process (docs/status.md): a thread of its own that answers the one request
// "status\n" with the process's facts and statusJson (status.h), one client at a time, and
// refuses anything else. It needs no Python and no lock that an op holds, so it answers while
// collectives hang and while the caller's thread holds the interpreter; a client that sends
// nothing is let go after a second.
#pragma once

#include <atomic>
#include <string>
#include <thread>

namespace ddl {

class Runtime;

class StatusServer {
 public:
  // Binds `address` (an IPv4 address) on a port the system picks and starts answering; `facts`:
  // a JSON object's members that begin every answer ("\"rank\": 3, ..."). Throws Error where the
  // address cannot be bound.
  StatusServer(Runtime& runtime, const std::string& address, std::string facts);
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  void answer(int client);

  Runtime& runtime_;
  std::string facts_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor writes, serve() returns
  int port_ = 0;
  std::thread thread_;
};

}  // namespace ddl
