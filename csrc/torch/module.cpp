// The Python module torch_ddl._C: the backend class and a few diagnostics for torch_ddl.info.
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "../core/engine/config.h"
#include "../core/engine/engine.h"
#include "../core/transport/ucx/ucx_transport.h"
#include "process_group_ddl.hpp"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  py::class_<ddl::ProcessGroupDDL, c10d::Backend, c10::intrusive_ptr<ddl::ProcessGroupDDL>>(
      m, "ProcessGroupDDL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>());

  m.def("config_table", [] {
    py::list rows;
    for (const ddl::ConfigEntry& e : ddl::configTable()) {
      rows.append(py::make_tuple(e.name, ddl::configValue(e), e.defaultValue, e.description));
    }
    return rows;
  });
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
  m.def("shared_buffers_live", [] { return ddl::Engine::process().sharedBuffers()->live(); });
  m.def("adopted_buffers", [] { return ddl::Engine::process().sharedBuffers()->adopted(); });
  m.def("ucx_version", &ddl::UcxTransport::version);
  m.def("cuda_built", [] { return ddl::cudaStreams() != nullptr; });
  m.def(
      "transport_devices", [] { return ddl::Engine::process().transportDevices(); },
      py::call_guard<py::gil_scoped_release>());
  m.def("shutdown", &ddl::Engine::shutdownProcess, py::call_guard<py::gil_scoped_release>());
}
