#include "call_print.h"

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
    case Collective::kWindowCreate:
      return "window creation (window " + std::to_string(count) + " of the group)";
    case Collective::kWindowRegister:
      return "tensor_register()";
    case Collective::kWindowDeregister:
      return "tensor_deregister()";
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

}  // namespace ddl
