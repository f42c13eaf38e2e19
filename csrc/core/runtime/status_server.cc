#include "status_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "../base/status.h"
#include "stats.h"
#include "status.h"

namespace ddl {

namespace {

constexpr size_t kMaxRequest = 256;
constexpr int kReadMillis = 1000;
constexpr std::chrono::milliseconds kProgressWait{500};

void sendAll(int fd, const std::string& text) {
  size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) sent += static_cast<size_t>(n);
  }
}

}  // namespace

StatusServer::StatusServer(Runtime& runtime, const std::string& address, std::string facts)
    : runtime_(runtime), facts_(std::move(facts)) {
  sockaddr_in where{};
  where.sin_family = AF_INET;
  if (::inet_pton(AF_INET, address.c_str(), &where.sin_addr) != 1) {
    throw Error("ddl: the status port's address '" + address + "' is not an IPv4 address",
                StatusKind::kInvalidArgument);
  }
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener_ < 0) throw Error(std::string("ddl: status port: socket: ") + std::strerror(errno));
  socklen_t length = sizeof(where);
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&where), sizeof(where)) != 0 ||
      ::listen(listener_, 64) != 0 ||
      ::getsockname(listener_, reinterpret_cast<sockaddr*>(&where), &length) != 0 ||
      ::pipe2(wake_, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listener_);
    throw Error("ddl: status port: cannot bind " + address + ": " + why);
  }
  port_ = ntohs(where.sin_port);
  thread_ = std::thread([this] { serve(); });
}

StatusServer::~StatusServer() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
  }
  ::close(listener_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void StatusServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    answer(client);
    ::close(client);
  }
}

void StatusServer::answer(int client) {
  // One line, within a second; nothing else is read.
  std::string request;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadMillis);
  while (request.find('\n') == std::string::npos && request.size() <= kMaxRequest) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    pollfd fd{client, POLLIN, 0};
    if (left <= 0 || ::poll(&fd, 1, left) <= 0) return;  // silent: let go
    char buffer[kMaxRequest + 1];
    const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  request = request.substr(0, request.find('\n'));
  if (request == "status") {
    const std::string state = statusJson(runtime_, kProgressWait);  // "{...}"
    sendAll(client, "{" + facts_ + ", " + state.substr(1) + "\n");
    return;
  }
  std::string shown = request.substr(0, 60);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  sendAll(client, "{\"error\": " +
                      jsonString("refused request '" + shown +
                                 "': this port answers only 'status' (python -m "
                                 "torch_ddl.status asks it)") +
                      "}\n");
}

}  // namespace ddl
