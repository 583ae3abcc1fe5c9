// The process's communicator for Python: which rank this is, how many there are, and the two
// collectives the PyTorch layer needs of its own (agreeing on initial weights and on a scratch
// directory name). The Engine's collectives run inside the Engine.
#include <cstdint>
#include <span>
#include <string>

#include <pybind11/stl.h>

#include "python/src/bindings.hpp"
#include "runtime/comm/communicator.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace strata::python {

std::shared_ptr<runtime::comm::Communicator> process_communicator() {
  // Function-local: constructed on first use, destroyed at exit before MPI is finalised (MpiComm
  // arranges MPI_Finalize in a static constructed while this one was being built).
  static const std::shared_ptr<runtime::comm::Communicator> communicator =
      runtime::comm::make_communicator();
  return communicator;
}

void bind_comm(py::module_& module) {
  module.def("rank", [] { return process_communicator()->rank(); },
             "This process's rank (0 without mpirun).");
  module.def("world_size", [] { return process_communicator()->size(); },
             "The number of ranks (1 without mpirun).");
  module.def("backend", [] { return std::string(process_communicator()->backend_name()); });
  module.def(
      "barrier", [] { process_communicator()->barrier(); },
      py::call_guard<py::gil_scoped_release>());
  // `address`: count contiguous fp32 values in host memory (a torch tensor's data_ptr()).
  module.def(
      "broadcast_floats",
      [](std::uintptr_t address, std::size_t count, int root) {
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the caller hands a tensor's data_ptr().
        auto* data = reinterpret_cast<float*>(address);
        process_communicator()->broadcast(std::span<float>(data, count), root);
      },
      "address"_a, "count"_a, "root"_a = 0, py::call_guard<py::gil_scoped_release>());
  module.def(
      "broadcast_text",
      [](const std::string& text, int root) {
        auto& comm = *process_communicator();
        std::uint64_t length = text.size();
        comm.broadcast(std::span<std::uint64_t>(&length, 1), root);
        std::string result = comm.rank() == root ? text : std::string(length, '\0');
        comm.broadcast(
            std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(result.data()), length), root);
        return result;
      },
      "text"_a, "root"_a = 0, "Every rank gets root's text.");
}

}  // namespace strata::python
