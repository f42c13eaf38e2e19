// The simulator's functions in torch_ddl._C (sim_bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace ddl {

void defineSimulator(pybind11::module_& m);

}  // namespace ddl
