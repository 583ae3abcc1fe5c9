// The passes both trainers (gpt_trainer.hpp: the built-in GPT; llm_trainer.hpp: Hugging Face
// decoders) run over their Engine, one unit at a time: each unit is gathered from wherever the
// config homes it just before its forward and again for its backward (with the embedding unit
// when it reads it: a tied head), and its gradient goes straight to reduce_grads. train_step()
// runs an optimizer step of several micro-batches over them.
//
// A Model offers units() (each with name, numel and reads_embedding), forward_unit(u, params,
// shared), backward_unit(u, params, grads, shared) and loss(); split_unit(spec, flat) (found by
// argument-dependent lookup in the model's namespace) cuts a unit's flat gradient per tensor.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/trace.hpp"
#include "base/assert.hpp"
#include "tiers/device/compute_fence.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {

// One optimizer step, as the progress line reports it.
struct StepReport {
  std::uint64_t step = 0;
  double loss = 0;           // mean over the step's micro-batches
  std::uint64_t tokens = 0;  // predicted tokens in the step, this rank
  double compute_s = 0;      // forward + backward arithmetic
  double gather_wait_s = 0;  // blocked in Engine::gather (NVMe reads, all-gathers, casts)
  double grads_s = 0;        // in Engine::reduce_grads (reduce-scatter, moves to the grad tier)
  double total_s = 0;
  runtime::StepStats optimizer;  // the Engine's own figures (optimizer time, I/O, bytes)
};

// A unit's gradient, `slots` at a time (2 when the passes run asynchronous unit calls: one unit's
// backward writes one slot while the last unit's gradient is reduced from the other), for units
// of up to `largest_numel` elements: device memory on a CUDA device (with the stream that scales
// it there), host memory otherwise. A trainer creates it before its Engine finalizes, so the
// gathered units the Engine caches fill only what is left of the device budget (the memory plan
// counts both).
class UnitGradBuffer {
 public:
  UnitGradBuffer(tiers::Device& device, std::size_t largest_numel, std::size_t slots = 1);

  std::size_t slots() const { return slots_; }
  // The first `numel` elements (numel <= largest_numel) of slot `slot` (< slots()).
  std::span<float> first(std::size_t numel, std::size_t slot = 0) const;
  // grads *= scale, in place, done when it returns; `grads` lies in this buffer.
  void scale(std::span<float> grads, float scale);

 private:
  std::vector<float> host_;
  tiers::DeviceBuffer device_;
  std::optional<tiers::Stream> stream_;  // CUDA only
  std::span<float> buffer_;              // host_ or device_: the slots one after the other
  std::size_t largest_numel_ = 0;
  std::size_t slots_ = 1;
  std::size_t stride_ = 0;  // elements from one slot's start to the next
};

// How a trainer calls its model ([Note: asynchronous unit calls] in docs/design.md):
//   kAuto: asynchronously where the model's calls can return queued (CUDA), else synchronously;
//   kSynchronous: every call waited for at its end (the schedule before, to compare);
//   kAsynchronous: the asynchronous schedule on the host too, over an ImmediateFence (tests: the
//     schedule alone changes no bit).
enum class UnitCalls : std::uint8_t { kAuto, kSynchronous, kAsynchronous };

// The fence the passes and the Engine wait on for `calls` (null: synchronous calls). Turns the
// model's asynchronous calls on unless kSynchronous.
template <class Model>
tiers::ComputeFence* unit_call_fence(Model& model, UnitCalls calls,
                                     tiers::ImmediateFence& immediate) {
  if (calls == UnitCalls::kSynchronous) return nullptr;
  tiers::ComputeFence* fence = model.enable_asynchronous_calls();
  if (fence == nullptr && calls == UnitCalls::kAsynchronous) fence = &immediate;
  return fence;
}

// What the passes run over: a model, the Engine that holds its parameters, the Engine's id of each
// of the model's units (same order), the tracer that records each unit's compute (may be null),
// and the fence of the model's asynchronous unit calls (null: each call returns done).
//
// With a fence ([Note: asynchronous unit calls] in docs/design.md) the Engine has it too
// (Engine::set_compute_fence), so a unit's handles are released as soon as its call is queued and
// the Engine waits before it frees the unit's buffers. The backward runs one unit behind on the
// host: unit u's backward is queued into one gradient slot, then unit u+1's gradient (the other
// slot) is waited for, scaled and reduced while the GPU computes u. The forward needs no wait
// until the loss. Either way the same calls reach the model and the Engine in the same order per
// unit, and reduce_grads sees the same gradients: the bits are those of the synchronous passes.
template <class Model>
struct UnitPasses {
  Model& model;
  runtime::Engine& engine;
  std::span<const runtime::UnitId> units;
  runtime::Tracer* tracer;
  tiers::ComputeFence* fence = nullptr;

  // Forward of every unit over the batch the model was given; returns its loss and keeps the
  // activations for backward(). `report` (may be null) gains the gather wait and compute time.
  double forward(StepReport* report) const;
  // Backward of every unit, last to first: each unit's gradient, times `gradient_scale`, goes to
  // reduce_grads. `report` gains the gather wait, compute and reduce_grads time.
  void backward(UnitGradBuffer& grads, float gradient_scale, StepReport& report) const;
};

// One optimizer step of `micro_batches` micro-batches. next_batch(m) gives the model
// micro-batch m and returns the tokens it predicts. Gradients are summed over the micro-batches:
// each is scaled by 1/micro_batches for the mean, and by the loss scale for fp16 (the Engine
// divides it out again before the update). The loss reported is the mean over ranks.
template <class Model, class NextBatch>
StepReport train_step(const UnitPasses<Model>& passes, UnitGradBuffer& grads,
                      runtime::comm::Communicator& comm, std::uint32_t micro_batches,
                      NextBatch&& next_batch);

namespace detail {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// A gathered unit, the embedding unit when it reads it (a tied head), and their tensors' views.
// With bf16 parameters, also their bf16 views (GatheredUnit::tensor_bf16), else those are empty.
struct GatheredPair {
  runtime::GatheredUnit unit;
  std::optional<runtime::GatheredUnit> embedding;
  std::vector<std::span<const float>> views;
  std::vector<std::span<const float>> shared;  // empty without the embedding
  std::vector<std::span<const std::uint16_t>> views_bf16, shared_bf16;
};

// A model that takes the bf16 views too (DecoderModel::kReadsBf16Views: its CUDA path feeds its
// products from them) gets them as a fifth argument.
template <class Model>
void forward_call(Model& model, std::size_t u, const GatheredPair& g) {
  if constexpr (requires { Model::kReadsBf16Views; }) {
    model.forward_unit(u, g.views, g.shared, {g.views_bf16, g.shared_bf16});
  } else {
    model.forward_unit(u, g.views, g.shared);
  }
}
template <class Model, class Grads>
void backward_call(Model& model, std::size_t u, const GatheredPair& g, const Grads& grads) {
  if constexpr (requires { Model::kReadsBf16Views; }) {
    model.backward_unit(u, g.views, grads, g.shared, {g.views_bf16, g.shared_bf16});
  } else {
    model.backward_unit(u, g.views, grads, g.shared);
  }
}
// Gathers unit `u` and, when `reads_embedding`, the embedding unit (units[0]); `wait_s` (may be
// null) gains the time blocked in the gathers.
GatheredPair gather_unit(runtime::Engine& engine, std::span<const runtime::UnitId> units,
                         std::size_t u, bool reads_embedding, double* wait_s);

// All-reduces the loss to its mean over ranks, then runs the Engine's step under the tracer.
void finish_step(runtime::Engine& engine, runtime::comm::Communicator& comm,
                 runtime::Tracer* tracer, StepReport& report);

}  // namespace detail

// With asynchronous calls compute_s counts the host's time in the calls and in the waits for
// their work (the loss, each gradient): the GPU's time that the host did not spend elsewhere.
template <class Model>
double UnitPasses<Model>::forward(StepReport* report) const {
  for (std::size_t u = 0; u < units.size(); ++u) {
    const auto& spec = model.units()[u];
    const detail::GatheredPair gathered =
        detail::gather_unit(engine, units, u, spec.reads_embedding,
                            report != nullptr ? &report->gather_wait_s : nullptr);
    const auto compute_start = detail::Clock::now();
    {
      runtime::Tracer::Scope scope(tracer, runtime::TraceTrack::kCompute, "forward " + spec.name);
      detail::forward_call(model, u, gathered);
    }
    if (report != nullptr) {
      report->compute_s += detail::seconds_between(compute_start, detail::Clock::now());
    }
  }
  const auto loss_start = detail::Clock::now();
  const double loss = model.loss();  // waits for the forward's work
  if (report != nullptr) {
    report->compute_s += detail::seconds_between(loss_start, detail::Clock::now());
  }
  return loss;
}

template <class Model>
void UnitPasses<Model>::backward(UnitGradBuffer& grads, float gradient_scale,
                                 StepReport& report) const {
  STRATA_ASSERT(fence == nullptr || grads.slots() >= 2,
                "asynchronous unit calls reduce one gradient while the next is computed");
  // A unit's gradient, computed (or queued, with `ticket`), to scale and reduce.
  struct Computed {
    std::size_t unit;
    std::span<float> grads;
    std::uint64_t ticket;
  };
  const auto reduce = [&](const Computed& done) {
    const auto wait_start = detail::Clock::now();
    if (fence != nullptr) fence->wait(done.ticket);
    if (gradient_scale != 1.0f) grads.scale(done.grads, gradient_scale);
    const auto grads_start = detail::Clock::now();
    report.compute_s += detail::seconds_between(wait_start, grads_start);
    engine.reduce_grads(units[done.unit], done.grads);
    report.grads_s += detail::seconds_between(grads_start, detail::Clock::now());
  };
  std::optional<Computed> last;  // asynchronous: the unit before, still to reduce
  for (std::size_t u = units.size(); u-- > 0;) {
    const auto& spec = model.units()[u];
    std::optional<detail::GatheredPair> gathered(
        detail::gather_unit(engine, units, u, spec.reads_embedding, &report.gather_wait_s));
    const auto compute_start = detail::Clock::now();
    const std::span<float> unit_grads = grads.first(spec.numel, u % grads.slots());
    {
      runtime::Tracer::Scope scope(tracer, runtime::TraceTrack::kCompute, "backward " + spec.name);
      detail::backward_call(model, u, *gathered, split_unit(spec, unit_grads));
    }
    report.compute_s += detail::seconds_between(compute_start, detail::Clock::now());
    const Computed computed{u, unit_grads, fence != nullptr ? fence->mark() : 0};
    // The leases end before the unit's reduce_grads (the embedding's, a tied head's, before the
    // embedding unit's); with a fence the Engine waits for the compute before freeing them.
    gathered.reset();
    if (fence == nullptr) {
      reduce(computed);
      continue;
    }
    if (last) reduce(*last);
    last = computed;
  }
  if (last) reduce(*last);
}

template <class Model, class NextBatch>
StepReport train_step(const UnitPasses<Model>& passes, UnitGradBuffer& grads,
                      runtime::comm::Communicator& comm, std::uint32_t micro_batches,
                      NextBatch&& next_batch) {
  const auto start = detail::Clock::now();
  StepReport report;
  const float scale = static_cast<float>(passes.engine.loss_scale() / micro_batches);
  for (std::uint32_t m = 0; m < micro_batches; ++m) {
    const std::uint64_t tokens = next_batch(m);
    report.loss += passes.forward(&report) / micro_batches;
    passes.backward(grads, scale, report);
    report.tokens += tokens;
  }
  detail::finish_step(passes.engine, comm, passes.tracer, report);
  report.total_s = detail::seconds_between(start, detail::Clock::now());
  return report;
}

}  // namespace strata::examples
