// Notice: what one rank of a group tells the others (group/notices.h), and its form on the wire.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../base/status.h"

namespace ddl {

struct Notice {
  // kOp: the op failed on the sender (calls that differ, an error of its own): the op ends, the
  // group goes on. kGroupTimeout: the op timed out on the sender; the group fails.
  // kRefusal: the sender refused its arguments and never started the op (the op fails, and no
  // rank can have finished it: what it shared with others may be given up cleanly).
  // kWaiting: the sender is still in the op halfway to its deadline and says whom it waits for
  // (text: "peers;not started", comma-separated ranks); nothing ends.
  // kNews: ranks the sender counts gone (`gone`: all it knows); the group fails. News floods
  // (Notices::floodNews) instead of going down a tree.
  enum class Type : uint8_t { kOp, kNews, kGroupTimeout, kRefusal, kWaiting };
  static constexpr size_t kMaxBytes = 4096;
  uint32_t sequence = 0;
  // The sender's group's (Group::incarnation): a notice of another group that held the id is
  // dropped.
  uint64_t incarnation = 0;
  Type type = Type::kOp;
  int from = -1;
  // Passed on down a binomial tree rooted at `from` (Notices::relayNotice), so that it reaches
  // every rank; false for one sent to chosen ranks only (wait reports in large groups).
  bool tree = true;
  // The ranks it says are gone, ascending (travel as ranges: a host, a rack or one side of a
  // partition is a few); a tree passes around them (Notices::relayNotice).
  std::vector<int> gone;
  // kNews: for each of `gone` (in order), the rank that counted it gone from what it saw itself
  // (the sender, where it did or where this is shorter: cut to fit).
  std::vector<int> witnesses;
  StatusKind kind = StatusKind::kOther;  // of the failure it reports
  std::string text;

  std::string encode() const;  // at most kMaxBytes (the text is cut to fit)
  // The notice as messages of at most kMaxBytes that together carry every gone rank: encode()'s
  // one where its ranges fit, else several, each a notice of its own with a stretch of them, their
  // witnesses as room allows, and the text (ranks gone in more places than one holds: a partition
  // that takes every other rank).
  std::vector<std::string> encodePieces() const;
  // The notice with only the gone ranks not in `known` (ascending), and their witnesses.
  Notice without(const std::vector<int>& known) const;
  static std::optional<Notice> decode(const char* data, size_t bytes);
};

// Why rank `r` is gone, as news from rank `from` tells: the witness's words where they are about
// r (a notice's words, `text`, are those of the first rank its sender told of).
std::string newsWords(int r, int witness, int from, const std::string& text);

}  // namespace ddl
