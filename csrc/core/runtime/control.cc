#include "control.h"

#include <cstring>

namespace ddl {

bool CallPrint::operator==(const CallPrint& other) const {
  return magic == other.magic && sequence == other.sequence && collective == other.collective &&
         type == other.type && reduce == other.reduce && root == other.root && count == other.count;
}

std::string CallPrint::describe() const {
  const std::string elements =
      std::to_string(count) + " x " +
      (type == kUnset ? std::string("?") : dataTypeName(static_cast<DataType>(type)));
  const std::string op = reduce == kUnset ? "" : reduceOpName(static_cast<ReduceOp>(reduce));
  const std::string rootRank = std::to_string(root);
  switch (collective) {
    case Collective::kNone:
      return "no collective";
    case Collective::kAllreduce:
      return "allreduce(" + op + ", " + elements + ")";
    case Collective::kBroadcast:
      return "broadcast(" + elements + " from rank " + rootRank + ")";
    case Collective::kAllgather:
      return "allgather(" + elements + " per rank)";
    case Collective::kAllgatherVarying:
      return "allgather(blocks of any size)";
    case Collective::kBarrier:
      return "barrier()";
    case Collective::kReduceScatter:
      return "reduce_scatter(" + op + ", " + elements + " per rank)";
    case Collective::kReduce:
      return "reduce(" + op + ", " + elements + " to rank " + rootRank + ")";
    case Collective::kGather:
      return "gather(" + elements + " per rank to rank " + rootRank + ")";
    case Collective::kScatter:
      return "scatter(" + elements + " per rank from rank " + rootRank + ")";
    case Collective::kAlltoall:
      return "all_to_all()";
  }
  return "collective " + std::to_string(static_cast<int>(collective));
}

CallPrint callPrint(Collective collective, size_t count, std::optional<DataType> type,
                    std::optional<ReduceOp> reduce, int root) {
  CallPrint print;
  print.collective = collective;
  print.count = count;
  if (type) print.type = static_cast<uint8_t>(*type);
  if (reduce) print.reduce = static_cast<uint8_t>(*reduce);
  print.root = root;
  return print;
}

namespace {

struct NoticeHeader {
  uint32_t magic;
  uint32_t sequence;
  int32_t from;
  uint8_t scope;
  uint8_t tree;
  uint8_t kind;   // StatusKind
  uint16_t gone;  // rank + 1, 0 for none
};
constexpr uint32_t kNoticeMagic = 0x6e646c64;  // "ddln"

}  // namespace

std::string Notice::encode() const {
  NoticeHeader header{kNoticeMagic,
                      sequence,
                      from,
                      static_cast<uint8_t>(scope),
                      static_cast<uint8_t>(tree ? 1 : 0),
                      static_cast<uint8_t>(kind),
                      static_cast<uint16_t>(gone + 1)};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), &header, sizeof(header));
  bytes += text.substr(0, kMaxBytes - sizeof(header));
  return bytes;
}

std::optional<Notice> Notice::decode(const char* data, size_t bytes) {
  NoticeHeader header;
  if (bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, data, sizeof(header));
  if (header.magic != kNoticeMagic || header.scope > static_cast<uint8_t>(Scope::kWaiting)) {
    return std::nullopt;
  }
  Notice notice;
  notice.sequence = header.sequence;
  notice.scope = static_cast<Scope>(header.scope);
  notice.from = header.from;
  notice.tree = header.tree != 0;
  notice.gone = static_cast<int>(header.gone) - 1;
  notice.kind =
      header.kind < kStatusKinds ? static_cast<StatusKind>(header.kind) : StatusKind::kOther;
  notice.text.assign(data + sizeof(header), bytes - sizeof(header));
  return notice;
}

}  // namespace ddl
