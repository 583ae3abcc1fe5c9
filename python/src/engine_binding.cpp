// Engine for Python: one strata Engine on the host device over the process's communicator, with
// the runtime's contracts checked here so that misuse from Python raises instead of tripping an
// assertion: units exist, calls come in order (add_unit, finalize, then training), gradient
// buffers have the unit's size, and no gathered unit is held across step(), save() or close().
//
// Memory crosses the boundary without copies: a GatheredUnit exposes the gathered fp32 values
// through the buffer protocol (torch.frombuffer views them, and keeps the GatheredUnit - hence the
// gather - alive as long as any view); gradients and initial values come in as a tensor's address
// and element count. Results that the Engine returns by value (shards, gathered masters) come back
// as FloatArray, a buffer that owns them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "python/src/bindings.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/engine/engine.hpp"
#include "tiers/device/device.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace strata::python {
namespace {

using runtime::Config;
using runtime::Engine;
using runtime::UnitId;

// "master", "exp_avg" or "exp_avg_sq" (the checkpoints' names) as the Engine's enum.
runtime::OptimizerState optimizer_state(const std::string& kind) {
  for (runtime::OptimizerState state :
       {runtime::OptimizerState::kMaster, runtime::OptimizerState::kExpAvg,
        runtime::OptimizerState::kExpAvgSq}) {
    if (runtime::to_string(state) == kind) return state;
  }
  throw std::invalid_argument(fmt::format(
      "state_shard(): unknown state kind '{}' (master, exp_avg or exp_avg_sq)", kind));
}

// Values the Engine returned by value, owned here and viewed by Python through the buffer protocol.
struct FloatArray {
  std::vector<float> values;
};

// (name, shape, weight_decay) of one tensor of a unit, as Python passes it.
using TensorArgs = std::tuple<std::string, std::vector<std::uint64_t>, bool>;

const float* float_pointer(std::uintptr_t address) {
  // The caller passes a contiguous fp32 tensor's data_ptr().
  return reinterpret_cast<const float*>(address);  // NOLINT(performance-no-int-to-ptr)
}

class PyEngine;

// One gathered unit; releases it when the last Python reference (a torch view included) dies.
class PyGathered {
 public:
  PyGathered(PyEngine& owner, runtime::GatheredUnit unit, std::uint64_t numel);
  ~PyGathered();
  PyGathered(const PyGathered&) = delete;
  PyGathered& operator=(const PyGathered&) = delete;

  py::buffer_info buffer() {
    auto* data = const_cast<float*>(unit_.tensor(0).data());  // by contract never written
    return py::buffer_info(data, sizeof(float), py::format_descriptor<float>::format(), 1,
                           {static_cast<py::ssize_t>(numel_)}, {sizeof(float)});
  }
  UnitId unit() const { return unit_.unit(); }
  std::uint64_t numel() const { return numel_; }

 private:
  PyEngine& owner_;
  runtime::GatheredUnit unit_;
  std::uint64_t numel_;
};

class PyEngine {
 public:
  PyEngine(const Config& config, bool resume, std::uint32_t grad_accumulation)
      : comm_(process_communicator()) {
    if (grad_accumulation == 0) throw std::invalid_argument("grad_accumulation must be >= 1");
    tiers::DeviceOptions device_options;
    device_options.kind = tiers::DeviceKind::kHost;
    device_options.budget_bytes = config.tiers.device.budget_bytes;
    device_ = tiers::make_device(device_options);
    runtime::EngineOptions options;
    options.resume = resume;
    options.grad_accumulation = grad_accumulation;
    engine_ = std::make_unique<Engine>(config, *device_, *comm_, options);
  }

  UnitId add_unit(const std::string& name, const std::vector<TensorArgs>& tensors) {
    Engine& engine = open("add_unit");
    if (finalized_) throw std::logic_error("add_unit after finalize");
    runtime::UnitSpec spec{name, {}};
    for (const auto& [tensor_name, shape, weight_decay] : tensors) {
      runtime::TensorSpec tensor{tensor_name, shape, runtime::TensorInit::zeros(), weight_decay};
      if (tensor.numel() == 0) {
        throw std::invalid_argument(
            fmt::format("unit '{}': tensor '{}' has no elements", name, tensor_name));
      }
      spec.tensors.push_back(std::move(tensor));
    }
    return engine.add_unit(std::move(spec));
  }

  void finalize() {
    Engine& engine = open("finalize");
    engine.finalize();
    finalized_ = true;
  }

  std::unique_ptr<PyGathered> gather(UnitId unit) {
    Engine& engine = training("gather", unit);
    runtime::GatheredUnit gathered = engine.gather(unit);
    return std::make_unique<PyGathered>(*this, std::move(gathered), engine.unit_numel(unit));
  }

  void reduce_grads(UnitId unit, std::uintptr_t address, std::uint64_t count) {
    Engine& engine = training("reduce_grads", unit);
    engine.reduce_grads(unit, std::span<const float>(float_pointer(address), count));
  }

  void set_master(UnitId unit, std::uintptr_t address, std::uint64_t count) {
    Engine& engine = training("set_master", unit);
    engine.set_master(unit, std::span<const float>(float_pointer(address), count));
  }

  py::dict step() {
    Engine& engine = between_steps("step");
    runtime::StepStats stats;
    {
      py::gil_scoped_release unlocked;
      stats = engine.step();
    }
    return py::dict("step"_a = stats.step, "grad_norm"_a = stats.grad_norm, "lr"_a = stats.lr,
                    "skipped"_a = stats.skipped, "loss_scale"_a = stats.loss_scale,
                    "nvme_read_bytes"_a = stats.nvme.read_bytes,
                    "nvme_written_bytes"_a = stats.nvme.written_bytes,
                    "io_wait_s"_a = stats.io_wait_s, "adam_s"_a = stats.adam_s,
                    "step_s"_a = stats.step_s, "comm_bytes"_a = stats.comm_bytes);
  }

  FloatArray state_shard(UnitId unit, const std::string& kind) {
    return {training("state_shard", unit).state_shard(unit, optimizer_state(kind))};
  }
  FloatArray gather_master(UnitId unit) {
    return {training("gather_master", unit).gather_master(unit)};
  }
  void save(const std::filesystem::path& dir) { between_steps("save").save(dir); }
  void load(const std::filesystem::path& dir) { between_steps("load").load(dir); }
  void set_learning_rate(double lr) { open("set_learning_rate").set_learning_rate(lr); }
  // Replaces the unit's overrides (None: the config's value); before or after finalize().
  void set_unit_hyperparams(UnitId unit, std::optional<double> lr,
                            std::optional<double> weight_decay, std::optional<double> beta1,
                            std::optional<double> beta2, std::optional<double> eps) {
    Engine& engine = open("set_unit_hyperparams");
    if (unit >= engine.unit_count()) {
      throw std::out_of_range(fmt::format(
          "set_unit_hyperparams(): unit {} does not exist ({} units)", unit, engine.unit_count()));
    }
    engine.set_unit_hyperparams(unit, {lr, weight_decay, beta1, beta2, eps});
  }

  std::uint64_t step_count() { return open("step_count").step_count(); }

  // Destroys the Engine now (its NVMe store closes, its memory returns); later calls raise.
  void close() {
    if (live_gathers_ > 0) {
      throw std::logic_error(
          fmt::format("close(): {} gathered unit(s) are still referenced", live_gathers_));
    }
    engine_.reset();
    device_.reset();
  }

  void gathered_opened() { ++live_gathers_; }
  void gathered_closed() { --live_gathers_; }

 private:
  Engine& open(const char* call) {
    if (!engine_) throw std::logic_error(fmt::format("{}(): the engine is closed", call));
    return *engine_;
  }
  Engine& training(const char* call, UnitId unit) {
    Engine& engine = open(call);
    if (!finalized_) throw std::logic_error(fmt::format("{}() before finalize()", call));
    if (unit >= engine.unit_count()) {
      throw std::out_of_range(
          fmt::format("{}(): unit {} does not exist ({} units)", call, unit, engine.unit_count()));
    }
    return engine;
  }
  Engine& between_steps(const char* call) {
    Engine& engine = open(call);
    if (!finalized_) throw std::logic_error(fmt::format("{}() before finalize()", call));
    if (live_gathers_ > 0) {
      throw std::logic_error(fmt::format(
          "{}(): {} gathered unit(s) are still referenced; drop every view of them first", call,
          live_gathers_));
    }
    return engine;
  }

  std::shared_ptr<runtime::comm::Communicator> comm_;
  std::unique_ptr<tiers::Device> device_;  // outlives engine_ (declared before it)
  std::unique_ptr<Engine> engine_;
  bool finalized_ = false;
  std::uint64_t live_gathers_ = 0;
};

PyGathered::PyGathered(PyEngine& owner, runtime::GatheredUnit unit, std::uint64_t numel)
    : owner_(owner), unit_(std::move(unit)), numel_(numel) {
  owner_.gathered_opened();
}

PyGathered::~PyGathered() {
  owner_.gathered_closed();
}

}  // namespace

void bind_engine(py::module_& module) {
  py::class_<FloatArray>(module, "FloatArray", py::buffer_protocol())
      .def_buffer([](FloatArray& array) {
        return py::buffer_info(array.values.data(), sizeof(float),
                               py::format_descriptor<float>::format(), 1,
                               {static_cast<py::ssize_t>(array.values.size())}, {sizeof(float)});
      })
      .def("__len__", [](const FloatArray& array) { return array.values.size(); });

  py::class_<PyGathered>(module, "GatheredUnit", py::buffer_protocol())
      .def_buffer(&PyGathered::buffer)
      .def_property_readonly("unit", &PyGathered::unit)
      .def("__len__", &PyGathered::numel);

  const auto unlocked = py::call_guard<py::gil_scoped_release>();
  py::class_<PyEngine>(module, "Engine")
      .def(py::init<const Config&, bool, std::uint32_t>(), "config"_a, "resume"_a = false,
           "grad_accumulation"_a = 1)
      .def("add_unit", &PyEngine::add_unit, "name"_a, "tensors"_a,
           "tensors: [(name, shape, weight_decay)]; returns the unit's id")
      .def("finalize", &PyEngine::finalize, unlocked)
      .def("gather", &PyEngine::gather, "unit"_a, py::keep_alive<0, 1>(), unlocked)
      .def("reduce_grads", &PyEngine::reduce_grads, "unit"_a, "address"_a, "count"_a, unlocked)
      .def("set_master", &PyEngine::set_master, "unit"_a, "address"_a, "count"_a, unlocked)
      .def("step", &PyEngine::step)
      .def("state_shard", &PyEngine::state_shard, "unit"_a, "kind"_a, unlocked)
      .def("gather_master", &PyEngine::gather_master, "unit"_a, unlocked)
      .def("save", &PyEngine::save, "dir"_a, unlocked)
      .def("load", &PyEngine::load, "dir"_a, unlocked)
      .def("set_learning_rate", &PyEngine::set_learning_rate, "lr"_a)
      .def("set_unit_hyperparams", &PyEngine::set_unit_hyperparams, "unit"_a, "lr"_a = py::none(),
           "weight_decay"_a = py::none(), "beta1"_a = py::none(), "beta2"_a = py::none(),
           "eps"_a = py::none(),
           "replaces the unit's optimizer overrides; None takes the config's value")
      .def("close", &PyEngine::close)
      .def_property_readonly("step_count", &PyEngine::step_count);
}

}  // namespace strata::python
