// The collectives of the c10d contract: each validates, maps dtype and op, stages what must be
// contiguous, and hands the core one call (launch()); the Work copies results back.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "arguments.hpp"
#include "compat.hpp"
#include "errors.hpp"
#include "process_group_ddl.hpp"
#include "reuse_tracker.hpp"
#include "sparse.hpp"

namespace ddl {

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* where = "all_reduce";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  if (tensor.defined() && tensor.layout() == c10::kSparse) return allreduceSparse(tensors, opts);
  DataType type = checkTensor(tensor, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLREDUCE, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, true);
  premultiply(opts.reduceOp, buffer, where);
  stageOnHost(buffer, *work);
  CallOptions options = callOptions(*work, opts);
  options.plan = comm_->allreducePlan(count(buffer), type);
  if (size_ > 1 && buffer.data_ptr() == tensor.data_ptr() && options.plan->offersAdoption) {
    options.adoptable = ReuseTracker::instance().adoptable(buffer);
  }
  return launch(work, options, [&](CallOptions& o) {
    comm_->allreduce(buffer.data_ptr(), count(buffer), type, op, o);
  });
}

// Sparse COO all_reduce (SUM), as gloo offers it: every rank's indices and values are gathered
// (blocks of different sizes around the ring), summed and coalesced; the input tensor takes the
// result.
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduceSparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* where = "all_reduce";
  at::Tensor& tensor = tensors[0];
  if (!tensor.device().is_cpu()) {
    badInput(where, "the sparse tensor is on " + tensor.device().str() +
                        "; ddl reduces sparse tensors on the CPU only");
  }
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) {
    badInput(where, "sparse tensors are reduced with ReduceOp.SUM only");
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLREDUCE, tensors);
  at::Tensor packed = packSparse(tensor.coalesce());
  auto blocks = std::make_shared<VaryingBlocks>();
  work->keepAlive(packed);
  work->thenRun([tensor, blocks] {
    at::Tensor sum = sumPackedSparse(*blocks, tensor);
    tensor.copy_(sum);
  });
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allgatherVarying(packed.data_ptr(), static_cast<size_t>(packed.numel()), blocks, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const char* where = "broadcast";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  if (opts.rootRank < 0 || opts.rootRank >= size_) {
    badInput(where, "src rank " + std::to_string(opts.rootRank) + " is not in a group of size " +
                        std::to_string(size_));
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::BROADCAST, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, rank_ != opts.rootRank);
  return launch(work, opts, [&](CallOptions& o) {
    comm_->broadcast(buffer.data_ptr(), count(buffer), type, static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather";
  CallScope scope(*comm_, where);
  at::Tensor& input = single(inputs, where);
  DataType type = checkTensor(input, where);
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    badInput(where, "needs a list of " + std::to_string(size_) + " output tensors, got " +
                        std::to_string(outputs.empty() ? 0 : outputs[0].size()));
  }
  for (const at::Tensor& out : outputs[0]) {
    if (checkTensor(out, where) != type || out.numel() != input.numel()) {
      badInput(where, "every output tensor must have the input's dtype (" +
                          std::string(c10::toString(input.scalar_type())) + ") and numel (" +
                          std::to_string(input.numel()) + ")");
    }
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLGATHER, outputs[0]);
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor gathered = at::empty({size_, input.numel()}, input.options());
  work->keepAlive(in);
  work->keepAlive(gathered);
  for (int r = 0; r < size_; ++r) work->copyAfter(outputs[0][r], gathered[r].view_as(input));
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allgather(in.data_ptr(), gathered.data_ptr(), count(in), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgatherIntoTensor(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather_into_tensor";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(input, where);
  checkSameType(where, output, type, "output");
  if (output.numel() != input.numel() * size_) {
    badInput(where, "output has " + std::to_string(output.numel()) + " elements; it needs " +
                        std::to_string(size_) + " x " + std::to_string(input.numel()));
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::_ALLGATHER_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor out = contiguousFor(output, *work, true);
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allgather(in.data_ptr(), out.data_ptr(), count(in), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::barrier(const c10d::BarrierOptions& opts) {
  const char* where = "barrier";
  auto work =
      c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  return launch(work, opts, [&](CallOptions& o) { comm_->barrier(o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const char* where = "reduce";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  checkRank(where, "dst", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::REDUCE, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, root);
  if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM && !root && buffer.is_same(tensor)) {
    buffer = buffer.clone();
    work->keepAlive(buffer);
  }
  premultiply(opts.reduceOp, buffer, where);
  return launch(work, opts, [&](CallOptions& o) {
    comm_->reduce(buffer.data_ptr(), root ? buffer.data_ptr() : nullptr, count(buffer), type, op,
                  static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* where = "gather";
  CallScope scope(*comm_, where);
  at::Tensor& input = single(inputs, where);
  DataType type = checkTensor(input, where);
  checkRank(where, "dst", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  checkRootList(where, outputs, input, root, size_, "destination", "output");
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::GATHER,
                                           root ? outputs[0] : std::vector<at::Tensor>{});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor gathered;
  if (root) {
    gathered = at::empty({size_, input.numel()}, input.options());
    work->keepAlive(gathered);
    for (int r = 0; r < size_; ++r) work->copyAfter(outputs[0][r], gathered[r].view_as(input));
  }
  return launch(work, opts, [&](CallOptions& o) {
    comm_->gather(in.data_ptr(), root ? gathered.data_ptr() : nullptr, count(in), type,
                  static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* where = "scatter";
  CallScope scope(*comm_, where);
  at::Tensor& output = single(outputs, where);
  DataType type = checkTensor(output, where);
  checkRank(where, "src", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  checkRootList(where, inputs, output, root, size_, "source", "input");
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::SCATTER, outputs);
  at::Tensor staged = root ? concatenate(inputs[0], output) : at::Tensor();
  if (root) work->keepAlive(staged);
  at::Tensor out = contiguousFor(output, *work, true);
  return launch(work, opts, [&](CallOptions& o) {
    comm_->scatter(root ? staged.data_ptr() : nullptr, out.data_ptr(), count(out), type,
                   static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter";
  CallScope scope(*comm_, where);
  at::Tensor& output = single(outputs, where);
  DataType type = checkTensor(output, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  if (inputs.size() != 1) badInput(where, "needs one list of inputs");
  checkList(where, inputs[0], output, output.numel(), size_);
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::REDUCE_SCATTER, outputs);
  at::Tensor staged = concatenate(inputs[0], output);
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t n = output.numel();
  work->copyAfter(output, staged.narrow(0, rank_ * n, n).view_as(output));
  return launch(work, opts, [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), count(output), type, op, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduceScatterTensor(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter_tensor";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(output, where);
  checkSameType(where, input, type, "input");
  if (input.numel() != output.numel() * size_) {
    badInput(where, "input has " + std::to_string(input.numel()) + " elements; it needs " +
                        std::to_string(size_) + " x " + std::to_string(output.numel()));
  }
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::_REDUCE_SCATTER_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor staged = input.reshape({-1}).clone(at::MemoryFormat::Contiguous);
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t n = output.numel();
  work->copyAfter(output, staged.narrow(0, rank_ * n, n).view_as(output));
  return launch(work, opts, [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), count(output), type, op, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoallSingle(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  const char* where = "all_to_all_single";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(input, where);
  checkSameType(where, output, type, "output");
  std::vector<int64_t> sendRows = splitsOf(where, "input", input, inputSplitSizes, size_);
  std::vector<int64_t> recvRows = splitsOf(where, "output", output, outputSplitSizes, size_);
  const int64_t inRow = input.dim() == 0 || input.size(0) == 0 ? 0 : input.numel() / input.size(0);
  const int64_t outRow =
      output.dim() == 0 || output.size(0) == 0 ? 0 : output.numel() / output.size(0);
  for (auto& r : sendRows) r *= inRow;
  for (auto& r : recvRows) r *= outRow;
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLTOALL_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor out = contiguousFor(output, *work, true);
  if (in.numel() > 0 && in.data_ptr() == out.data_ptr()) {
    in = in.clone();
    work->keepAlive(in);
  }
  AlltoallLayout layout = layoutOf(sendRows, recvRows, elementSize(type));
  return launch(work, opts,
                [&](CallOptions& o) { comm_->alltoall(in.data_ptr(), out.data_ptr(), layout, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const char* where = "all_to_all";
  CallScope scope(*comm_, where);
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != inputs.size()) {
    badInput(where, "needs " + std::to_string(size_) + " input and output tensors, got " +
                        std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  DataType type = checkTensor(inputs[0], where);
  std::vector<int64_t> sendElements, recvElements;
  for (int p = 0; p < size_; ++p) {
    if (checkTensor(inputs[p], where) != type || checkTensor(outputs[p], where) != type) {
      badInput(where, "every tensor must have dtype " +
                          std::string(c10::toString(inputs[0].scalar_type())));
    }
    sendElements.push_back(inputs[p].numel());
    recvElements.push_back(outputs[p].numel());
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLTOALL, outputs);
  at::Tensor in = concatenate(inputs, inputs[0]);
  int64_t total = 0;
  for (int64_t e : recvElements) total += e;
  at::Tensor out = at::empty({total}, inputs[0].options());
  work->keepAlive(in);
  work->keepAlive(out);
  int64_t offset = 0;
  for (int p = 0; p < size_; ++p) {
    work->copyAfter(outputs[p], out.narrow(0, offset, recvElements[p]).view_as(outputs[p]));
    offset += recvElements[p];
  }
  AlltoallLayout layout = layoutOf(sendElements, recvElements, elementSize(type));
  return launch(work, opts,
                [&](CallOptions& o) { comm_->alltoall(in.data_ptr(), out.data_ptr(), layout, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                     int tag) {
  const char* where = "send";
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  checkRank(where, "dst", dstRank, size_);
  if (coalescing_.load()) return joinBatch(tensors, true, dstRank, tag, where);
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::SEND, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, false);
  work->keepAlive(buffer);
  return launch(work, c10d::kUnsetTimeout, [&](CallOptions& o) {
    comm_->send(buffer.data_ptr(), count(buffer) * elementSize(type), dstRank,
                static_cast<uint32_t>(tag), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::receive(std::vector<at::Tensor>& tensors,
                                                        int srcRank, int tag, c10d::OpType type,
                                                        const char* where) {
  at::Tensor& tensor = single(tensors, where);
  DataType dtype = checkTensor(tensor, where);
  if (srcRank != -1) checkRank(where, "src", srcRank, size_);
  if (coalescing_.load()) return joinBatch(tensors, false, srcRank, tag, where);
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, type, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, true);
  return launch(work, c10d::kUnsetTimeout, [&](CallOptions& o) {
    comm_->recv(buffer.data_ptr(), count(buffer) * elementSize(dtype), srcRank,
                static_cast<uint32_t>(tag), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                     int tag) {
  return receive(tensors, srcRank, tag, c10d::OpType::RECV, "recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return receive(tensors, -1, tag, c10d::OpType::RECVANYSOURCE, "recv");
}

void ProcessGroupDDL::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const char* where = "monitored_barrier";
  auto work =
      c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  launch(work, opts, [&](CallOptions& o) { comm_->monitoredBarrier(waitAllRanks, o); });
  work->wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* where = "all_reduce_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, tensors);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  // One allreduce over the tensors laid end to end.
  auto work =
      c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLREDUCE_COALESCED, tensors);
  at::Tensor flat = concatenate(tensors, tensors[0]);
  work->keepAlive(flat);
  premultiply(opts.reduceOp, flat, where);
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    work->copyAfter(t, flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
  stageOnHost(flat, *work);
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allreduce(flat.data_ptr(), count(flat), type, op, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgatherIntoTensorCoalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather_into_tensor_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  if (outputs.size() != inputs.size()) badInput(where, "needs one output per input");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (checkTensor(outputs[i], where) != type || outputs[i].numel() != inputs[i].numel() * size_) {
      badInput(where, "output " + std::to_string(i) + " needs dtype " +
                          std::string(c10::toString(inputs[0].scalar_type())) + " and " +
                          std::to_string(size_) + " x " + std::to_string(inputs[i].numel()) +
                          " elements");
    }
  }
  // One allgather of the inputs laid end to end; output i takes its column of each block.
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::COALESCED, outputs);
  at::Tensor flat = concatenate(inputs, inputs[0]);
  at::Tensor gathered = at::empty({size_, flat.numel()}, flat.options());
  work->keepAlive(flat);
  work->keepAlive(gathered);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t n = inputs[i].numel();
    // Copy sources must be views (a reshape of this strided column would copy now, too early).
    at::Tensor column = gathered.narrow(1, offset, n);
    if (outputs[i].is_contiguous()) {
      work->copyAfter(outputs[i].view({size_, n}), column);
    } else {
      at::Tensor staged = at::empty({size_, n}, flat.options());
      work->keepAlive(staged);
      work->copyAfter(staged, column);
      work->copyAfter(outputs[i], staged.view(outputs[i].sizes()));
    }
    offset += n;
  }
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allgather(flat.data_ptr(), gathered.data_ptr(), count(flat), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's inputs[i] (rank-major, as torch documents it).
  const char* where = "all_gather_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  if (outputLists.size() != static_cast<size_t>(size_)) {
    badInput(where, "needs " + std::to_string(size_) + " output lists, one per rank, got " +
                        std::to_string(outputLists.size()));
  }
  std::vector<at::Tensor> all;
  for (int r = 0; r < size_; ++r) {
    if (outputLists[r].size() != inputs.size()) {
      badInput(where, "output list " + std::to_string(r) + " needs " +
                          std::to_string(inputs.size()) + " tensors, one per input");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (checkTensor(outputLists[r][i], where) != type ||
          outputLists[r][i].numel() != inputs[i].numel()) {
        badInput(where, "output " + std::to_string(r) + "/" + std::to_string(i) +
                            " must match input " + std::to_string(i) + " in dtype and numel");
      }
    }
    all.insert(all.end(), outputLists[r].begin(), outputLists[r].end());
  }
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::ALLGATHER_COALESCED, all);
  at::Tensor flat = concatenate(inputs, inputs[0]);
  at::Tensor gathered = at::empty({size_, flat.numel()}, flat.options());
  work->keepAlive(flat);
  work->keepAlive(gathered);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t n = inputs[i].numel();
    for (int r = 0; r < size_; ++r) {
      work->copyAfter(outputLists[r][i], gathered[r].narrow(0, offset, n).view_as(inputs[i]));
    }
    offset += n;
  }
  return launch(work, opts, [&](CallOptions& o) {
    comm_->allgather(flat.data_ptr(), gathered.data_ptr(), count(flat), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduceScatterTensorCoalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter_tensor_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  if (outputs.size() != inputs.size()) badInput(where, "needs one output per input");
  std::vector<at::Tensor> columns;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (checkTensor(outputs[i], where) != type || inputs[i].numel() != outputs[i].numel() * size_) {
      badInput(where, "input " + std::to_string(i) + " needs " + std::to_string(size_) + " x " +
                          std::to_string(outputs[i].numel()) + " elements");
    }
    columns.push_back(inputs[i].reshape({size_, outputs[i].numel()}));
  }
  // Block r of the staged buffer holds block r of every input, so one reduce-scatter serves all.
  auto work = c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::COALESCED, outputs);
  at::Tensor staged = at::cat(columns, 1).contiguous();
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t block = staged.size(1);
  int64_t offset = 0;
  for (at::Tensor& out : outputs) {
    work->copyAfter(out, staged[rank_].narrow(0, offset, out.numel()).view_as(out));
    offset += out.numel();
  }
  return launch(work, opts, [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), static_cast<size_t>(block), type, op, o);
  });
}

}  // namespace ddl
