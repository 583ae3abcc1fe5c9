#include "models/checkpoint/weights_loader.hpp"

#include <algorithm>

#include "runtime/comm/communicator.hpp"

namespace strata::llm {

void load_units(const HfCheckpoint& checkpoint, const std::vector<UnitSpec>& units,
                runtime::comm::Communicator& comm, const UnitSink& sink) {
  const bool split = comm.size() > 1 && comm.buffer_memory() == runtime::comm::BufferMemory::kHost;
  if (!split) {
    load_units(checkpoint, units, sink);
    return;
  }
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto rank = static_cast<std::size_t>(comm.rank());
  std::vector<float> slice;
  std::vector<float> whole;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t numel = units[u].numel;
    const std::size_t slice_numel = (numel + ranks - 1) / ranks;
    const std::size_t first = std::min(numel, rank * slice_numel);
    const std::size_t mine = std::min(numel, first + slice_numel) - first;
    slice.assign(slice_numel, 0.0f);  // the padding past numel is gathered and dropped
    checkpoint.read_unit_range(units[u], first, std::span<float>(slice).first(mine));
    whole.resize(slice_numel * ranks);
    comm.all_gather(std::span<const float>(slice), std::span<float>(whole));
    sink(u, std::span<const float>(whole).first(numel));
  }
}

void load_units(const HfCheckpoint& checkpoint, const std::vector<UnitSpec>& units,
                const UnitSink& sink) {
  std::vector<float> whole;
  for (std::size_t u = 0; u < units.size(); ++u) {
    whole.resize(units[u].numel);
    checkpoint.read_unit_range(units[u], 0, whole);
    sink(u, whole);
  }
}

}  // namespace strata::llm
