// Liveness of peer processes on this host, watched through pidfds: a peer that exits (killed,
// crashed or done) makes the ops that need it fail within milliseconds, naming it, instead of
// at the group's timeout. Peers on other hosts (or in another PID namespace, as emulated hosts
// are) cannot be watched this way and are left to the transport and the timeout.
//
// A process is identified by what makes it one on a machine: boot id, PID namespace, PID and
// its start time (so a recycled PID is never taken for the peer). Ranks send theirs up the
// creation tree with their cards (group/bootstrap.h); each rank watches the peers whose boot id
// and PID namespace are its own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../transport/transport.h"

namespace ddl {

struct ProcessIdentity {
  std::string bootId;
  uint64_t pidNamespace = 0;
  pid_t pid = 0;
  uint64_t startTime = 0;  // clock ticks after boot (/proc/<pid>/stat, field 22)

  static ProcessIdentity self();
  std::string encode() const;
  static ProcessIdentity decode(const std::string& text);
  bool sameMachineAndNamespace(const ProcessIdentity& other) const;
};

// Process identities by group rank: a rank's host's other processes, the only ones it can watch.
using Identities = std::map<int, ProcessIdentity>;

// Progress thread only.
class PeerWatch {
 public:
  ~PeerWatch();
  // Watches `identity` as `peer`; false when it cannot (not here, gone already: then it is
  // reported lost at the next poll()).
  bool watch(PeerId peer, const ProcessIdentity& identity);
  // File descriptors to sleep on (readable when a watched process exits).
  std::vector<int> fds() const;
  // Peers that exited since the last call, with a description ("pid 123 on this host exited").
  std::vector<std::pair<PeerId, std::string>> poll();

 private:
  struct Watched {
    PeerId peer;
    pid_t pid;
  };
  std::map<int, Watched> byFd_;
  std::map<PeerId, int> byPeer_;
  std::vector<std::pair<PeerId, std::string>> goneAlready_;
};

}  // namespace ddl
