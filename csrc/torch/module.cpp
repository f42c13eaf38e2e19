// The Python module torch_ddl._C: the backend class and a few diagnostics for torch_ddl.info.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "../core/base/config.h"
#include "../core/group/engine.h"
#include "../core/runtime/status.h"
#include "../core/runtime/status_server.h"
#include "../core/runtime/trace.h"
#include "../core/shm/shared_arena.h"
#include "../core/topology/allreduce_plan.h"
#include "../core/topology/cost_model.h"
#include "../core/transport/ucx/ucx_transport.h"
#include "process_group_ddl.hpp"
#include "shared_allocator.hpp"
#include "sim_bindings.hpp"
#include "window.hpp"

namespace py = pybind11;

namespace {

// For each size in bytes of float32: (bytes, [(plan, predicted seconds), ...]), the chosen
// plan first.
py::list planRows(const ddl::Topology& topology, const ddl::LinkCosts& links,
                  const std::vector<int64_t>& sizes,
                  const ddl::PlanRequest& request = ddl::planRequest()) {
  py::list rows;
  const ddl::PlanBook book(topology, links, request, false);
  for (int64_t bytes : sizes) {
    py::list candidates;
    for (const ddl::AllreducePlan& plan : book.candidates(static_cast<size_t>(bytes) / 4, 4)) {
      candidates.append(py::make_tuple(plan.describe(), plan.predicted));
    }
    rows.append(py::make_tuple(bytes, candidates));
  }
  return rows;
}

template <typename Fn>
auto valueErrors(Fn fn) {
  try {
    return fn();
  } catch (const ddl::Error& e) {
    throw py::value_error(e.what());
  }
}

#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
// What a recording completion hook was given: (completion key, duration in ms or None).
struct CompletionRecord {
  using Calls = std::vector<std::pair<uint64_t, std::optional<float>>>;
  std::mutex mutex;
  Calls calls;
};

// The record of each hook id, replaced when a hook of that id is registered again.
std::map<int64_t, std::shared_ptr<CompletionRecord>>& completionRecords(
    std::unique_lock<std::mutex>& lock) {
  static std::mutex mutex;
  static std::map<int64_t, std::shared_ptr<CompletionRecord>> records;
  lock = std::unique_lock<std::mutex>(mutex);
  return records;
}
#endif

// A call's timeout left unset: the group's.
constexpr std::chrono::milliseconds kUnsetTimeout{-1};

// ddl's window. From torch 2.14 on it is a c10d.Window (whose methods torch binds); before, the
// same methods are bound here, a timeout (timedelta) standing for the options torch adds. Either
// way `route` and `id` are ddl's own.
void bindWindow(py::module_& m) {
  using ddl::WindowDDL;
#ifdef DDL_TORCH_HAS_WINDOW
  py::class_<WindowDDL, c10d::Window, c10::intrusive_ptr<WindowDDL>> window(m, "Window");
#else
  py::class_<WindowDDL, c10::intrusive_ptr<WindowDDL>> window(m, "Window");
  window
      .def("tensor_register", &WindowDDL::tensor_register, py::arg("tensor"),
           py::arg("owning") = true)
      .def("tensor_deregister", &WindowDDL::tensor_deregister)
      .def("map_remote_tensor", &WindowDDL::map_remote_tensor, py::arg("rank"))
      .def(
          "put",
          [](WindowDDL& w, const at::Tensor& tensor, int64_t dst, int64_t offset, bool asyncOp,
             std::optional<std::chrono::milliseconds> timeout) {
            return w.put(tensor, dst, offset, asyncOp, timeout.value_or(kUnsetTimeout));
          },
          py::arg("tensor"), py::arg("dst_rank"), py::arg("target_offset_nelems"),
          py::arg("async_op"), py::arg("timeout") = py::none())
      .def(
          "signal",
          [](WindowDDL& w, int64_t peer, bool asyncOp,
             std::optional<std::chrono::milliseconds> timeout) {
            return w.signal(peer, asyncOp, timeout.value_or(kUnsetTimeout));
          },
          py::arg("peer_rank"), py::arg("async_op"), py::arg("timeout") = py::none())
      .def(
          "wait_signal",
          [](WindowDDL& w, int64_t peer, bool asyncOp,
             std::optional<std::chrono::milliseconds> timeout) {
            return w.waitSignal(peer, asyncOp, timeout.value_or(kUnsetTimeout));
          },
          py::arg("peer_rank"), py::arg("async_op"), py::arg("timeout") = py::none());
#endif
  window.def("route", &WindowDDL::route, py::arg("peer_rank"))
      .def_property_readonly("id", &WindowDDL::id);
}

using Backend =
    py::class_<ddl::ProcessGroupDDL, c10d::Backend, c10::intrusive_ptr<ddl::ProcessGroupDDL>>;

#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
// Completion hooks are C++-only in torch 2.15: a hook that records what it is given, for
// the tests (hook_id as registerCompletionHook's), and what it recorded.
void bindCompletionRecords(Backend& backend) {
  backend
      .def("_record_completions",
           [](ddl::ProcessGroupDDL& pg, int64_t hookId) {
             auto record = std::make_shared<CompletionRecord>();
             pg.registerCompletionHook(hookId, [record](const c10d::CompletionHookArgs& args) {
               std::lock_guard<std::mutex> lock(record->mutex);
               record->calls.emplace_back(args.completionKey, args.duration_ms);
             });
             std::unique_lock<std::mutex> lock;
             completionRecords(lock)[hookId] = record;
           })
      .def_static("_recorded_completions", [](int64_t hookId) {
        std::shared_ptr<CompletionRecord> record;
        {
          std::unique_lock<std::mutex> lock;
          auto& records = completionRecords(lock);
          auto it = records.find(hookId);
          if (it == records.end()) return CompletionRecord::Calls{};
          record = it->second;
        }
        std::lock_guard<std::mutex> lock(record->mutex);
        return record->calls;
      });
}
#endif

// What the planner makes of a group's ops: its allreduce plan and allgather schedule per size,
// and every plan it weighs.
void bindPlans(Backend& backend) {
  backend
      // The plan the group's allreduce of `nbytes` of float32 takes.
      .def("allreduce_plan",
           [](const ddl::ProcessGroupDDL& pg, int64_t nbytes) {
             return valueErrors([&] {
               if (nbytes < 0) throw ddl::Error("allreduce_plan: negative size");
               return pg.communicator()
                   ->allreducePlan(static_cast<size_t>(nbytes) / 4, ddl::DataType::kFloat32)
                   ->describe();
             });
           })
      // How the group's allgather of `nbytes` per rank runs: ring, grid, bruck or grid_bruck.
      .def("allgather_schedule",
           [](const ddl::ProcessGroupDDL& pg, int64_t nbytes) {
             return valueErrors([&] {
               if (nbytes < 0) throw ddl::Error("allgather_schedule: negative size");
               return std::string(ddl::allgatherScheduleName(
                   pg.communicator()->planBook().allgatherSchedule(static_cast<size_t>(nbytes))));
             });
           })
      // How the group's all_to_all runs: pairwise or bruck.
      .def("alltoall_schedule",
           [](const ddl::ProcessGroupDDL& pg) {
             return pg.communicator()->planBook().alltoallSchedule() ==
                            ddl::AlltoallSchedule::kBruck
                        ? "bruck"
                        : "pairwise";
           })
      // How the group's gather of `nbytes` a rank runs: linear or tree.
      .def("gather_schedule",
           [](const ddl::ProcessGroupDDL& pg, int64_t nbytes) {
             return valueErrors([&] {
               if (nbytes < 0) throw ddl::Error("gather_schedule: negative size");
               return std::string(pg.communicator()->planBook().gatherSchedule(
                                      static_cast<size_t>(nbytes)) == ddl::GatherSchedule::kTree
                                      ? "tree"
                                      : "linear");
             });
           })
      .def("plan_rows", [](const ddl::ProcessGroupDDL& pg, const std::vector<int64_t>& sizes) {
        return valueErrors([&] {
          // What the group's own planner settings make of each size (its request is the one in
          // effect when it was created).
          const auto& comm = pg.communicator();
          return planRows(comm->topology(), comm->links(), sizes, comm->planBook().request());
        });
      });
}

// The backend class: ProcessGroupDDL and what ddl adds to it.
void bindBackend(py::module_& m) {
  Backend backend(m, "ProcessGroupDDL");
  backend
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("topology",
           [](const ddl::ProcessGroupDDL& pg) { return pg.communicator()->topology().describe(); })
      .def("links",
           [](const ddl::ProcessGroupDDL& pg) { return pg.communicator()->links().describe(); })
      // The hosts the group found, in order: (name, [group ranks]).
      .def("hosts",
           [](const ddl::ProcessGroupDDL& pg) {
             const ddl::Topology& t = pg.communicator()->topology();
             std::vector<std::pair<std::string, std::vector<int>>> out;
             const std::vector<std::vector<int>> members = t.members(0);
             for (size_t h = 0; h < members.size(); ++h) {
               out.emplace_back(t.levels[0].blockName(static_cast<int>(h)), members[h]);
             }
             return out;
           })
      // The timeout the group's ops get when the call names none (set_timeout changes it).
      .def_property_readonly(
          "timeout", [](const ddl::ProcessGroupDDL& pg) { return pg.communicator()->timeout(); })
      // c10d's getError (torch's Python Backend has no binding for it).
      .def("get_error", &ddl::ProcessGroupDDL::getError)
      // The group's first failure as ddl's Status: kind, the ranks it names, the words, and
      // whether another rank reported it (torch_ddl.failure).
      .def("failure",
           [](const ddl::ProcessGroupDDL& pg) {
             const ddl::GroupState::Failure f = pg.communicator()->firstFailure();
             py::dict out;
             out["kind"] = std::string(ddl::statusKindName(f.status.kind));
             out["ranks"] = f.status.ranks;
             out["detail"] = f.status.detail;
             out["remote"] = f.remote;
             out["gone"] = pg.communicator()->goneRanks();
             return out;
           })
      // dist._time_estimator's calls (torch binds them for NCCL only).
      .def("_start_time_estimate", &ddl::ProcessGroupDDL::startTimeEstimate)
      .def("_end_time_estimate", &ddl::ProcessGroupDDL::endTimeEstimate)
      .def("host_rings", [](const ddl::ProcessGroupDDL& pg) {
        std::pair<int, int> counts;
        {
          py::gil_scoped_release released;  // the progress thread may be waiting for Python
          counts = pg.communicator()->hostRings();
        }
        py::dict out;
        out["shared_memory"] = counts.first;
        out["messages"] = counts.second;
        return out;
      });
#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
  bindCompletionRecords(backend);
#endif
  backend
      // One-sided windows on every torch (torch_ddl.new_window); from torch 2.14 on also
      // ProcessGroup.new_window / dist._new_window.
      .def("_new_window", &ddl::ProcessGroupDDL::newWindow, py::arg("tensor") = py::none());
  bindPlans(backend);
}

// The process's status port (torch_ddl/_status.py), started with its first group.
std::mutex gStatusMutex;
std::unique_ptr<ddl::StatusServer> gStatusServer;

// What python -m torch_ddl.status and the metrics read (torch_ddl/_status.py).
void bindStatus(py::module_& m) {
  m.def(
      "status_json",
      [](int64_t waitMs) {
        return ddl::statusJson(ddl::Engine::process().runtime(),
                               std::chrono::milliseconds(std::max<int64_t>(waitMs, 0)));
      },
      py::arg("wait_ms") = 500, py::call_guard<py::gil_scoped_release>());
  m.def(
      "stats_json",
      [] {
        ddl::Runtime& runtime = ddl::Engine::process().runtime();
        return runtime.stats().json(runtime.clock().now());
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "start_status_server",
      [](const std::string& address, const std::string& facts) {
        std::lock_guard<std::mutex> lock(gStatusMutex);
        if (!gStatusServer) {
          gStatusServer =
              std::make_unique<ddl::StatusServer>(ddl::Engine::process().runtime(), address, facts);
        }
        return gStatusServer->port();
      },
      py::call_guard<py::gil_scoped_release>());
}

// The process's own: configuration, shared buffers, the flight recorder, the transport.
void bindProcess(py::module_& m) {
  m.def("config_table", [] {
    py::list rows;
    for (const ddl::ConfigEntry& e : ddl::configTable()) {
      rows.append(py::make_tuple(e.name, ddl::configValue(e), e.defaultValue, e.description));
    }
    return rows;
  });
  m.def("agreed_settings", &ddl::agreedSettingNames);
  m.def("check_config", [] {
    try {
      ddl::reloadConfig();
    } catch (const ddl::Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("shared_buffer", [](int64_t bytes) {
    if (bytes < 0) throw py::value_error("shared_buffer: negative size " + std::to_string(bytes));
    std::shared_ptr<ddl::SharedBuffers> buffers = ddl::Engine::process().sharedBuffers();
    void* data = nullptr;
    {
      py::gil_scoped_release released;
      data = buffers->allocate(static_cast<size_t>(bytes));
    }
    return torch::from_blob(
        data, {bytes}, [buffers](void* p) { buffers->release(p); },
        torch::TensorOptions().dtype(torch::kUInt8));
  });
  m.def("install_shared_allocator", [] {
    try {
      return ddl::installSharedAllocatorIfAsked();
    } catch (const ddl::Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("shared_allocator", [] {
    size_t minBytes = 0;
    const bool installed = ddl::sharedAllocatorInstalled(&minBytes);
    const ddl::SharedArena::Usage u = ddl::SharedArena::process().usage();
    py::dict d;
    d["installed"] = installed;
    d["min_bytes"] = minBytes;
    d["segments"] = u.segments;
    d["segment_bytes"] = u.segmentBytes;
    d["blocks"] = u.blocks;
    d["block_bytes"] = u.blockBytes;
    d["given_back"] = u.givenBack;
    return d;
  });
  m.def("shared_buffers_live", [] { return ddl::Engine::process().sharedBuffers()->live(); });
  m.def("adopted_buffers", [] { return ddl::Engine::process().sharedBuffers()->adopted(); });
  m.def("ucx_version", &ddl::UcxTransport::version);
  m.def(
      "endpoints_opened", [] { return ddl::Engine::process().endpoints(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "dump_trace",
      [](const std::string& path) {
        return ddl::Engine::process().runtime().recorder().write(path);
      },
      py::arg("path") = "");
  m.def("trace_bytes",
        [] { return py::bytes(ddl::Engine::process().runtime().recorder().dump()); });
  m.def("cuda_built", [] { return ddl::cudaStreams() != nullptr; });
  m.def(
      "transport_devices", [] { return ddl::Engine::process().transportDevices(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "shutdown",
      [] {
        {
          std::lock_guard<std::mutex> lock(gStatusMutex);
          gStatusServer.reset();  // before the runtime it asks
        }
        ddl::Engine::shutdownProcess();
      },
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  bindBackend(m);
  bindWindow(m);
  m.def("waive_quorum", &ddl::ProcessGroupDDL::waiveQuorum,
        "shrink_group on this thread does (not) require a quorum of the group to be left");

  // Offline: the topology of ranks on the named hosts (by rank), racks and links as in
  // TORCH_DDL_TOPOLOGY and TORCH_DDL_LINKS.
  m.def("plan_offline", [](const std::vector<std::string>& hostOf, const std::string& racks,
                           const std::string& links, const std::vector<int64_t>& sizes) {
    return valueErrors([&] {
      std::vector<ddl::Locality> ranks;
      for (const std::string& h : hostOf) ranks.push_back(ddl::Locality{h, h});
      ddl::Topology topology = ddl::buildTopology(ranks, ddl::parseRackMap(racks));
      ddl::LinkCosts costs = ddl::parseLinks(links);
      return py::make_tuple(topology.describe(), costs.describe(),
                            planRows(topology, costs, sizes));
    });
  });

  ddl::defineSimulator(m);
  bindProcess(m);
  bindStatus(m);
}
