// strata._strata: the extension module. docs/python.md describes the Python API built on it.
#include "python/src/bindings.hpp"

PYBIND11_MODULE(_strata, module) {
  module.doc() = "strata's runtime (config, communicator, ZeRO-3 Engine) for Python";
  strata::python::bind_config(module);
  strata::python::bind_comm(module);
  strata::python::bind_engine(module);
}
