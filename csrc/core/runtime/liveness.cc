#include "liveness.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ddl {
namespace {

uint64_t startTimeOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  // Field 2 (the command) may hold spaces and parentheses: count fields after its last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

std::string gone(pid_t pid) { return "its process (pid " + std::to_string(pid) + ") exited"; }

}  // namespace

ProcessIdentity ProcessIdentity::self() {
  ProcessIdentity id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, id.bootId);
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) == 0) id.pidNamespace = st.st_ino;
  id.pid = getpid();
  id.startTime = startTimeOf(id.pid);
  return id;
}

std::string ProcessIdentity::encode() const {
  return bootId + " " + std::to_string(pidNamespace) + " " + std::to_string(pid) + " " +
         std::to_string(startTime);
}

ProcessIdentity ProcessIdentity::decode(const std::string& text) {
  ProcessIdentity id;
  std::istringstream in(text);
  in >> id.bootId >> id.pidNamespace >> id.pid >> id.startTime;
  return id;
}

bool ProcessIdentity::sameMachineAndNamespace(const ProcessIdentity& other) const {
  return !bootId.empty() && bootId == other.bootId && pidNamespace != 0 &&
         pidNamespace == other.pidNamespace;
}

PeerWatch::~PeerWatch() {
  for (auto& [fd, w] : byFd_) close(fd);
}

bool PeerWatch::watch(PeerId peer, const ProcessIdentity& identity) {
  if (byPeer_.count(peer) > 0) return true;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, identity.pid, 0));
  if (fd < 0) {
    if (errno == ESRCH) goneAlready_.emplace_back(peer, gone(identity.pid));
    return false;
  }
  // The pidfd names whatever process has the PID now: make sure it is the peer.
  if (startTimeOf(identity.pid) != identity.startTime) {
    close(fd);
    goneAlready_.emplace_back(peer, gone(identity.pid));
    return false;
  }
  byFd_[fd] = Watched{peer, identity.pid};
  byPeer_[peer] = fd;
  return true;
}

std::vector<int> PeerWatch::fds() const {
  std::vector<int> fds;
  for (const auto& [fd, w] : byFd_) fds.push_back(fd);
  return fds;
}

std::vector<std::pair<PeerId, std::string>> PeerWatch::poll() {
  std::vector<std::pair<PeerId, std::string>> lost;
  lost.swap(goneAlready_);
  if (byFd_.empty()) return lost;
  std::vector<pollfd> fds;
  for (const auto& [fd, w] : byFd_) fds.push_back(pollfd{fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) <= 0) return lost;
  for (const pollfd& p : fds) {
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Watched w = byFd_.at(p.fd);
    lost.emplace_back(w.peer, gone(w.pid));
    byPeer_.erase(w.peer);
    byFd_.erase(p.fd);
    close(p.fd);
  }
  return lost;
}

}  // namespace ddl
