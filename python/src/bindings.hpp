// The pieces of the extension module strata._strata, one function per concept; module.cpp calls
// them in order. The module is a thin layer over the runtime's public API (runtime/engine/engine.hpp,
// runtime/config/config.hpp, runtime/comm/communicator.hpp, the host device): the PyTorch logic lives in
// python/strata/*.py.
#pragma once

#include <memory>

#include <pybind11/pybind11.h>

namespace strata::runtime::comm {
class Communicator;
}

namespace strata::python {

// The process's communicator (LocalComm, or MpiComm under mpirun), created on first use and kept
// until the process exits: MPI can be initialised only once per process.
std::shared_ptr<runtime::comm::Communicator> process_communicator();

// Config, its enums, load_config / parse_config, and the ConfigError exception.
void bind_config(pybind11::module_& module);
// rank(), world_size(), barrier(), broadcast helpers over process_communicator().
void bind_comm(pybind11::module_& module);
// Engine (on the host device), GatheredUnit and FloatArray.
void bind_engine(pybind11::module_& module);

}  // namespace strata::python
