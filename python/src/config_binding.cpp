// Config for Python: load_config / parse_config, the fields the PyTorch layer reads or overrides
// (optimizer hyper-parameters, the parameters' precision, device kind), and ConfigError as a Python exception
// (a ValueError) whose message is strata's and whose attributes say where: file, line, column, key.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "python/src/bindings.hpp"
#include "runtime/config/config.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace strata::python {
namespace {

using runtime::Config;
using runtime::ConfigError;
using strata::DType;
using runtime::OptimizerConfig;
using runtime::PrecisionConfig;

void bind_enums(py::module_& module) {
  py::enum_<DType>(module, "DType")
      .value("fp32", DType::kFp32)
      .value("bf16", DType::kBf16)
      .value("fp16", DType::kFp16);
  py::enum_<runtime::DeviceKind>(module, "DeviceKind")
      .value("auto", runtime::DeviceKind::kAuto)
      .value("host", runtime::DeviceKind::kHost)
      .value("cuda", runtime::DeviceKind::kCuda);
}

void bind_sections(py::module_& module) {
  py::class_<OptimizerConfig>(module, "OptimizerConfig")
      .def_readwrite("lr", &OptimizerConfig::lr)
      .def_readwrite("beta1", &OptimizerConfig::beta1)
      .def_readwrite("beta2", &OptimizerConfig::beta2)
      .def_readwrite("eps", &OptimizerConfig::eps)
      .def_readwrite("weight_decay", &OptimizerConfig::weight_decay)
      .def_readwrite("grad_clip", &OptimizerConfig::grad_clip);
  py::class_<PrecisionConfig>(module, "PrecisionConfig")
      .def_readwrite("params", &PrecisionConfig::params);
}

void bind_config_class(py::module_& module) {
  py::class_<Config>(module, "Config")
      .def_readonly("source", &Config::source)
      .def_readwrite("optimizer", &Config::optimizer)
      .def_readwrite("precision", &Config::precision)
      .def_property(
          "device_kind", [](const Config& c) { return c.tiers.device.kind; },
          [](Config& c, runtime::DeviceKind kind) { c.tiers.device.kind = kind; });
}

// ConfigError -> strata.ConfigError(ValueError) carrying strata's message and where it points.
void bind_config_error(py::module_& module) {
  static py::handle error_type = [&] {
    py::object builtins = py::module_::import("builtins");
    py::object type = builtins.attr("type")("ConfigError", py::make_tuple(builtins.attr("ValueError")),
                                            py::dict("__module__"_a = "strata",
                                                     "__doc__"_a = "A strata config error: "
                                                                   "file, line, column, key."));
    module.attr("ConfigError") = type;
    return type.release();
  }();
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const ConfigError& error) {
      py::object instance = error_type(error.what());
      instance.attr("file") = error.file();
      instance.attr("line") = error.line();
      instance.attr("column") = error.column();
      instance.attr("key") = error.key_path();
      PyErr_SetObject(error_type.ptr(), instance.ptr());
    }
  });
}

}  // namespace

void bind_config(py::module_& module) {
  bind_enums(module);
  bind_sections(module);
  bind_config_class(module);
  bind_config_error(module);
  module.def("load_config", &runtime::load_config, "path"_a,
             "Reads and validates a TOML config file (raises ConfigError).");
  module.def("parse_config", &runtime::parse_config, "text"_a, "source_name"_a = "<string>",
             "Validates TOML text; source_name stands for the file in messages.");
}

}  // namespace strata::python
