#include "runtime/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <optional>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "base/assert.hpp"
#include "io/file_handle.hpp"
#include "io/whole_file.hpp"
#include "runtime/checkpoint/checkpoint_rotation.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/engine/stream_staging.hpp"

namespace strata::runtime::detail {
namespace {

constexpr const char* kFormat = "strata-checkpoint";
constexpr int kVersion = 1;

// The kinds a checkpoint keeps: the fp32 master weights and the optimizer's moments. The 16-bit
// parameters are the master rounded (rebuilt on load), the gradients are zero between steps.
std::vector<Kind> saved_kinds(const UnitState& unit) {
  std::vector<Kind> kinds = {Kind::kMaster};
  if (unit.has(Kind::kExpAvg)) kinds.push_back(Kind::kExpAvg);
  if (unit.has(Kind::kExpAvgSq)) kinds.push_back(Kind::kExpAvgSq);
  return kinds;
}

std::string rank_file_name(std::uint32_t rank) {
  return fmt::format("rank{:05}.bin", rank);
}

std::string hex(std::uint64_t value) {
  return fmt::format("{:016x}", value);
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Hash of what makes two models' states interchangeable: units, tensors and shapes.
std::uint64_t model_hash(const EngineState& state) {
  std::string text;
  for (const UnitState& unit : state.units()) {
    text += unit.spec.name + "{";
    for (const TensorSpec& tensor : unit.spec.tensors) {
      text += tensor.name + shape_text(tensor.shape) + ";";
    }
    text += "}";
  }
  return XXH3_64bits(text.data(), text.size());
}

// Hash of the training configuration (recorded for diagnosis; a changed learning rate on resume
// is legitimate, so loading does not refuse a different one).
std::uint64_t config_hash(const EngineState& state) {
  const OptimizerConfig& opt = state.config().optimizer;
  const std::string text = fmt::format(
      "{} lr={} b1={} b2={} eps={} wd={} clip={} bc={} params={} grads={} seed={} "
      "warmup={} schedule={} decay_steps={} min_lr={}{}",
      to_string(opt.type), opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.grad_clip,
      opt.bias_correction, to_string(state.config().precision.params),
      to_string(state.config().precision.grads), state.config().run.seed, opt.warmup_steps,
      to_string(opt.schedule), opt.lr_decay_steps, opt.min_lr,
      // fp32 state adds nothing, so hashes recorded before the state formats existed still match.
      compressed_state(state.config())
          ? fmt::format(" state={} master={}{}", cpu_adam::state_dtype_name(opt.state_dtype),
                        cpu_adam::state_dtype_name(opt.master_dtype),
                        opt.master_rounding == MasterRounding::kKahan ? " kahan" : "")
          : std::string());
  return XXH3_64bits(text.data(), text.size());
}

// Runs `body` on every rank; when any rank fails, every rank throws (the failing rank its own
// error), so no rank waits forever in a later collective.
template <typename Body>
void collectively(comm::Communicator& comm, std::string_view what, Body&& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  const bool any = comm.any_rank(error != nullptr);
  if (error) std::rethrow_exception(error);
  if (any) throw std::runtime_error(fmt::format("{} failed on another rank (see its error)", what));
}

// Bytes [offset, offset + out.size()) of a checkpoint rank file; a file that ends before them is
// truncated (CheckpointCorruption naming the file and both lengths).
void read_segment(const io::FileHandle& file, std::uint64_t offset, std::span<std::byte> out) {
  const std::size_t got = file.read_at(offset, out);
  if (got < out.size()) {
    throw CheckpointCorruption(fmt::format(
        "checkpoint file {} ends at {} bytes; the manifest needs bytes up to {} (truncated)",
        file.path(), offset + got, offset + out.size()));
  }
}

nlohmann::json read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kManifestName;
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& error) {
    throw CheckpointCorruption(
        fmt::format("checkpoint manifest {} is not valid JSON: {}", path.string(), error.what()));
  }
  if (!manifest.is_object() || manifest.value("format", "") != kFormat) {
    throw CheckpointCorruption(fmt::format(
        "{} is not a strata checkpoint manifest (no \"format\": \"{}\")", path.string(), kFormat));
  }
  return manifest;
}

// Where the bytes of one (old rank, unit, kind) segment are.
struct Segment {
  std::uint64_t offset = 0;
  std::uint64_t numel = 0;
  std::uint64_t checksum = 0;
};

// The model a manifest describes is this engine's: units, tensors, shapes, parameter dtype and
// optimizer. Throws CheckpointMismatch naming the first difference.
void validate_model(const EngineState& state, const nlohmann::json& manifest,
                    const std::string& where) {
  if (manifest.at("version").get<int>() != kVersion) {
    throw CheckpointMismatch(fmt::format("{} has format version {}; this build reads {}", where,
                                         manifest.at("version").dump(), kVersion));
  }
  const auto dtype = manifest.at("param_dtype").get<std::string>();
  if (dtype != dtype_name(state.param_dtype())) {
    throw CheckpointMismatch(
        fmt::format("{} holds a model trained with {} parameters; this run has {} "
                    "([precision] params)",
                    where, dtype, dtype_name(state.param_dtype())));
  }
  const auto optimizer = manifest.at("optimizer").get<std::string>();
  if (optimizer != to_string(state.config().optimizer.type)) {
    throw CheckpointMismatch(
        fmt::format("{} holds {} optimizer state; this run uses {} ([optimizer] type)", where,
                    optimizer, to_string(state.config().optimizer.type)));
  }
  const nlohmann::json& units = manifest.at("units");
  if (units.size() != state.units().size()) {
    throw CheckpointMismatch(
        fmt::format("{} holds {} units; this model has {} (another model shape)", where,
                    units.size(), state.units().size()));
  }
  for (std::size_t u = 0; u < state.units().size(); ++u) {
    const UnitState& unit = state.units()[u];
    const nlohmann::json& saved = units[u];
    const auto name = saved.at("name").get<std::string>();
    if (name != unit.spec.name) {
      throw CheckpointMismatch(
          fmt::format("{} has unit {} named '{}'; this model's is '{}' (another model shape)",
                      where, u, name, unit.spec.name));
    }
    const nlohmann::json& tensors = saved.at("tensors");
    if (tensors.size() != unit.spec.tensors.size()) {
      throw CheckpointMismatch(
          fmt::format("{} has {} tensors in unit '{}'; this model has {} (another model shape)",
                      where, tensors.size(), name, unit.spec.tensors.size()));
    }
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const TensorSpec& spec = unit.spec.tensors[t];
      const auto tensor_name = tensors[t].at("name").get<std::string>();
      const auto shape = tensors[t].at("shape").get<std::vector<std::uint64_t>>();
      if (tensor_name != spec.name || shape != spec.shape) {
        throw CheckpointMismatch(fmt::format(
            "{} has tensor '{}.{}' of shape {}; this model has '{}.{}' of shape {} "
            "(another model shape)",
            where, name, tensor_name, shape_text(shape), name, spec.name, shape_text(spec.shape)));
      }
    }
    if (saved.at("numel").get<std::uint64_t>() != unit.layout.numel) {
      throw CheckpointMismatch(fmt::format("{} unit '{}' has {} elements; this has {}", where, name,
                                           saved.at("numel").dump(), unit.layout.numel));
    }
  }
}

// The model description both checkpoints and the NVMe store's sidecar record.
void describe_model(const EngineState& state, nlohmann::json& manifest) {
  manifest["format"] = kFormat;
  manifest["version"] = kVersion;
  manifest["ranks"] = state.ranks();
  manifest["param_dtype"] = dtype_name(state.param_dtype());
  manifest["optimizer"] = to_string(state.config().optimizer.type);
  manifest["model_hash"] = hex(model_hash(state));
  manifest["config_hash"] = hex(config_hash(state));
  nlohmann::json units = nlohmann::json::array();
  for (const UnitState& unit : state.units()) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const TensorSpec& tensor : unit.spec.tensors) {
      tensors.push_back({{"name", tensor.name}, {"shape", tensor.shape}});
    }
    nlohmann::json kinds = nlohmann::json::array();
    for (Kind kind : saved_kinds(unit)) kinds.push_back(kind_name(kind));
    units.push_back({{"name", unit.spec.name},
                     {"numel", unit.layout.numel},
                     {"shard_numel", unit.layout.shard_numel},
                     {"kinds", kinds},
                     {"tensors", tensors}});
  }
  manifest["units"] = units;
}

// XXH3 over bytes fed a piece at a time (the same value as XXH3_64bits of them all at once).
class StreamingChecksum {
 public:
  StreamingChecksum() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    reset();
  }
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  ~StreamingChecksum() { XXH3_freeState(state_); }
  void reset() { XXH3_64bits_reset(state_); }
  void update(std::span<const std::byte> bytes) {
    XXH3_64bits_update(state_, bytes.data(), bytes.size());
  }
  std::uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

// This rank's file: the real elements of every saved kind of every unit, fp32, in unit order,
// streamed a sub-group at a time through one sub-group of staging. Returns each segment's checksum.
std::vector<std::uint64_t> write_rank_file(EngineState& state, const std::filesystem::path& path) {
  const io::FileHandle file = io::FileHandle::open(
      path, {io::CreateMode::kCreateTruncate, io::DirectIo::kOff, io::Access::kReadWrite});
  StreamStaging staging(state.staging_meter(), state.largest_group_numel());
  StreamingChecksum hash;
  std::vector<std::uint64_t> checksums;
  std::uint64_t offset = 0;
  for (UnitId u = 0; u < state.units().size(); ++u) {
    const UnitState& unit = state.units()[u];
    const std::uint64_t real = unit.layout.shard_real_numel(state.rank());
    for (Kind kind : saved_kinds(unit)) {
      hash.reset();
      for (std::size_t g = 0; g < unit.groups.size() && unit.groups[g].begin < real; ++g) {
        const SubGroup& sub = unit.groups[g];
        const std::span<float> values = staging.first(sub.numel);
        state.read_group_fp32(u, kind, g, values);
        const auto bytes = std::as_bytes(values.first(std::min(sub.numel, real - sub.begin)));
        hash.update(bytes);
        file.write_at(offset, bytes);
        offset += bytes.size();
      }
      checksums.push_back(hash.digest());
    }
  }
  file.sync();
  return checksums;
}

// The manifest: the model, the progress, and every rank file's segments with their checksums
// (`all_checksums`: each rank's, in rank order).
nlohmann::json make_manifest(const EngineState& state,
                             const std::vector<std::uint64_t>& all_checksums) {
  nlohmann::json manifest;
  describe_model(state, manifest);
  const TrainingProgress progress = state.progress();
  manifest["step"] = progress.step;
  manifest["loss_scale"] = progress.loss_scale;
  manifest["clean_steps"] = progress.clean_steps;
  nlohmann::json files = nlohmann::json::array();
  std::size_t index = 0;
  for (std::uint32_t r = 0; r < state.ranks(); ++r) {
    nlohmann::json segments = nlohmann::json::array();
    nlohmann::json shard_begins = nlohmann::json::array();
    std::uint64_t offset = 0;
    for (const UnitState& unit : state.units()) {
      const std::uint64_t real = unit.layout.shard_real_numel(r);
      for (Kind kind : saved_kinds(unit)) {
        segments.push_back({{"kind", kind_name(kind)},
                            {"offset", offset},
                            {"numel", real},
                            {"xxh3", hex(all_checksums[index++])}});
        offset += real * 4;
      }
      shard_begins.push_back(unit.layout.shard_begin(r));
    }
    files.push_back({{"rank", r},
                     {"name", rank_file_name(r)},
                     {"bytes", offset},
                     {"shard_begin_per_unit", shard_begins},
                     {"segments", segments}});
  }
  manifest["files"] = files;
  return manifest;
}

// Writes the manifest into the complete temporary directory (the last file: its presence marks
// the directory complete), then swaps it in (checkpoint_rotation.hpp).
void publish(const nlohmann::json& manifest, const std::filesystem::path& temporary,
             const std::filesystem::path& dir) {
  io::write_file_atomically(temporary / kManifestName, manifest.dump(1));  // fsyncs file, `temporary`
  publish_checkpoint(dir);
}

// Reads a checkpoint written by any rank count: this rank's new shard of each unit is cut from
// whichever old ranks' files hold its elements (old rank r held [r * S, min(numel, (r + 1) * S))
// of a unit whose old shard size is S). Validates the model first (CheckpointMismatch); every
// segment is checked against the layout and its checksum (CheckpointCorruption). Memory: the
// caller's staging only; segments are hashed and copied a staging's worth at a time.
class ShardReader {
 public:
  ShardReader(const EngineState& state, const nlohmann::json& manifest,
              const std::filesystem::path& dir)
      : state_(state), files_(manifest.at("files")), dir_(dir), where_("checkpoint " + dir.string()) {
    validate_model(state, manifest, where_);
    old_ranks_ = manifest.at("ranks").get<std::uint32_t>();
    if (old_ranks_ == 0 || files_.size() != old_ranks_) {
      throw CheckpointMismatch(fmt::format(
          "checkpoint {} was written by {} ranks but lists {} rank files (incomplete layout)",
          where_, old_ranks_, files_.size()));
    }
    const nlohmann::json& units = manifest.at("units");
    for (std::size_t u = 0; u < state.units().size(); ++u) {
      const UnitState& unit = state.units()[u];
      old_shard_.push_back(units[u].at("shard_numel").get<std::uint64_t>());
      if (old_shard_[u] == 0 || old_shard_[u] * old_ranks_ < unit.layout.numel) {
        throw CheckpointMismatch(fmt::format(
            "checkpoint {} unit '{}': {} ranks x shard {} do not cover its {} elements "
            "(rank-incompatible layout)",
            where_, unit.spec.name, old_ranks_, old_shard_[u], unit.layout.numel));
      }
    }
    opened_.resize(old_ranks_);
  }

  // Checks, against their checksums, every segment that this rank's new shard of unit u draws
  // from (all saved kinds), reading each through `staging` and keeping nothing.
  void verify_unit(std::size_t u, StreamStaging& staging) {
    const std::span<std::byte> chunk = staging.bytes();
    STRATA_ASSERT(!chunk.empty(), "no staging");
    const Range mine = new_range(u);
    for (std::uint32_t r = 0; r < old_ranks_; ++r) {
      const Range old = old_range(u, r);
      if (std::max(mine.begin, old.begin) >= std::min(mine.end, old.end)) continue;
      for (std::size_t k = 0; k < saved_kinds(state_.units()[u]).size(); ++k) {
        const Segment segment = segment_of(u, r, k);
        const std::uint64_t bytes = segment.numel * 4;
        hash_.reset();
        for (std::uint64_t done = 0; done < bytes; done += chunk.size()) {
          const std::span<std::byte> piece = chunk.first(std::min<std::uint64_t>(chunk.size(), bytes - done));
          read_segment(*opened_[r], segment.offset + done, piece);
          hash_.update(piece);
        }
        if (hash_.digest() != segment.checksum) {
          throw CheckpointCorruption(fmt::format(
              "checkpoint {}: checksum mismatch in {} at offset {} ({} bytes, unit '{}' {}); "
              "the file is corrupt, refusing to use it",
              where_, opened_[r]->path(), segment.offset, bytes, state_.units()[u].spec.name,
              kind_name(saved_kinds(state_.units()[u])[k])));
        }
      }
    }
  }

  // Elements [first, first + out.size()) of unit u (real elements, in unit order) of its saved
  // kind k, read from the old ranks' files that hold them (verified by verify_unit before).
  void read_range(std::size_t u, std::size_t k, std::uint64_t first, std::span<float> out) {
    const std::uint64_t last = first + out.size();
    for (std::uint32_t r = 0; r < old_ranks_; ++r) {
      const Range old = old_range(u, r);
      const std::uint64_t from = std::max(first, old.begin);
      const std::uint64_t to = std::min(last, old.end);
      if (from >= to) continue;
      const Segment segment = segment_of(u, r, k);
      read_segment(*opened_[r], segment.offset + (from - old.begin) * 4,
                   std::as_writable_bytes(out.subspan(from - first, to - from)));
    }
  }

 private:
  struct Range {
    std::uint64_t begin = 0;  // elements of the unit, real ones only
    std::uint64_t end = 0;
  };
  Range new_range(std::size_t u) const {
    const UnitLayout& layout = state_.units()[u].layout;
    const std::uint64_t begin = std::min(layout.numel, layout.shard_begin(state_.rank()));
    return {begin, begin + layout.shard_real_numel(state_.rank())};
  }
  Range old_range(std::size_t u, std::uint32_t r) const {
    const std::uint64_t numel = state_.units()[u].layout.numel;
    const std::uint64_t begin = std::min(numel, r * old_shard_[u]);
    return {begin, std::min(numel, begin + old_shard_[u])};
  }

  // Old rank r's segment of saved kind k of unit u, checked against the layout; opens r's file
  // when first needed.
  Segment segment_of(std::size_t u, std::uint32_t r, std::size_t k) {
    const std::vector<Kind> kinds = saved_kinds(state_.units()[u]);
    const nlohmann::json& segments = files_[r].at("segments");
    const std::filesystem::path path = dir_ / files_[r].at("name").get<std::string>();
    if (segments.size() != state_.units().size() * kinds.size()) {
      throw CheckpointCorruption(
          fmt::format("checkpoint {}: {} lists {} segments, expected {}", where_, path.string(),
                      segments.size(), state_.units().size() * kinds.size()));
    }
    if (!opened_[r]) {
      opened_[r] = io::FileHandle::open(
          path, {io::CreateMode::kOpenExisting, io::DirectIo::kOff, io::Access::kReadOnly});
    }
    const std::size_t index = u * kinds.size() + k;
    const nlohmann::json& entry = segments[index];
    const Segment segment{entry.at("offset").get<std::uint64_t>(),
                          entry.at("numel").get<std::uint64_t>(),
                          std::stoull(entry.at("xxh3").get<std::string>(), nullptr, 16)};
    const Range old = old_range(u, r);
    if (segment.numel != old.end - old.begin ||
        entry.at("kind").get<std::string>() != kind_name(kinds[k])) {
      throw CheckpointCorruption(fmt::format(
          "checkpoint {}: segment {} of {} is '{}' of {} elements; the layout needs '{}' of {}",
          where_, index, path.string(), entry.at("kind").dump(), segment.numel,
          kind_name(kinds[k]), old.end - old.begin));
    }
    return segment;
  }

  const EngineState& state_;
  const nlohmann::json& files_;
  std::filesystem::path dir_;
  std::string where_;
  std::uint32_t old_ranks_ = 0;
  std::vector<std::uint64_t> old_shard_;  // per unit
  std::vector<std::optional<io::FileHandle>> opened_;  // per old rank, opened when first needed
  StreamingChecksum hash_;
};

// Calls fn(group, values, first, real) for every sub-group of this rank's shard of unit u:
// `values` the group's span of `staging` (numel values), `first` the unit element its first value
// stands for and `real` how many of its leading values are real elements (the rest is padding).
template <typename Fn>
void for_each_group(EngineState& state, UnitId u, StreamStaging& staging, Fn&& fn) {
  const UnitState& unit = state.units()[u];
  const std::uint64_t begin = std::min(unit.layout.numel, unit.layout.shard_begin(state.rank()));
  const std::uint64_t real = unit.layout.shard_real_numel(state.rank());
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    const std::uint64_t group_real = sub.begin < real ? std::min(sub.numel, real - sub.begin) : 0;
    fn(g, staging.first(sub.numel), begin + std::min(sub.begin, real), group_real);
  }
}

}  // namespace

// "ckpt/" names the directory "ckpt" (its siblings "ckpt.tmp" and "ckpt.old" hold the swap).
std::filesystem::path directory_name(const std::filesystem::path& dir) {
  return dir.has_filename() ? dir : dir.parent_path();
}

void save_checkpoint(EngineState& state, const std::filesystem::path& requested) {
  STRATA_ASSERT(state.finalized(), "save before finalize");
  const std::filesystem::path dir = directory_name(requested);
  comm::Communicator& comm = state.comm();
  const std::filesystem::path temporary = staging_path(dir);
  collectively(comm, "checkpoint save (preparing the directory)", [&] {
    if (state.rank() == 0) prepare_staging(dir);
  });
  state.drain_gradient_writes();
  std::vector<std::uint64_t> checksums;
  collectively(comm, "checkpoint save (writing shards)", [&] {
    checksums = write_rank_file(state, temporary / rank_file_name(state.rank()));
  });
  std::vector<std::uint64_t> all_checksums(checksums.size() * state.ranks());
  if (state.ranks() > 1) {
    state.all_gather_host(comm::ConstBuffer::of(std::span<const std::uint64_t>(checksums)),
                          comm::MutableBuffer::of(std::span<std::uint64_t>(all_checksums)));
  } else {
    all_checksums = checksums;
  }
  collectively(comm, "checkpoint save (manifest and rename)", [&] {
    if (state.rank() == 0) publish(make_manifest(state, all_checksums), temporary, dir);
  });
}

void load_checkpoint(EngineState& state, const std::filesystem::path& requested) {
  STRATA_ASSERT(state.finalized(), "load before finalize");
  // A crash during save() may leave the newest complete checkpoint under <dir>.tmp or <dir>.old.
  const std::filesystem::path requested_dir = directory_name(requested);
  const std::filesystem::path dir =
      newest_complete_checkpoint(requested_dir).value_or(requested_dir);
  const auto malformed = [&](const nlohmann::json::exception& error) {
    return CheckpointCorruption(fmt::format("checkpoint manifest {} is malformed: {}",
                                            (dir / kManifestName).string(), error.what()));
  };
  TrainingProgress progress;
  nlohmann::json manifest;
  std::optional<ShardReader> reader;
  StreamStaging staging(state.staging_meter(), state.largest_group_numel());
  // Two passes, so that a failed load changes nothing without holding the checkpoint in memory:
  // the first checks every segment this rank needs against its checksum, the second copies.
  collectively(state.comm(), "checkpoint load", [&] {
    manifest = read_manifest(dir);
    try {
      reader.emplace(state, manifest, dir);
      for (std::size_t u = 0; u < state.units().size(); ++u) reader->verify_unit(u, staging);
      progress.step = manifest.at("step").get<std::uint64_t>();
      progress.loss_scale = manifest.at("loss_scale").get<double>();
      progress.clean_steps = manifest.at("clean_steps").get<std::uint32_t>();
    } catch (const nlohmann::json::exception& error) {
      throw malformed(error);
    }
  });

  // Everything checked out on every rank: replace the state, a sub-group at a time.
  state.begin_replace();
  collectively(state.comm(), "checkpoint load (writing state)", [&] {
    for (UnitId u = 0; u < state.units().size(); ++u) {
      const std::vector<Kind> kinds = saved_kinds(state.units()[u]);
      for_each_group(state, u, staging, [&](std::size_t g, std::span<float> values,
                                            std::uint64_t first, std::uint64_t real) {
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          std::fill(values.begin(), values.end(), 0.0f);
          reader->read_range(u, k, first, values.first(real));
          state.write_group_fp32(u, kinds[k], g, values);
          // The 16-bit parameters are the master rounded.
          if (kinds[k] == Kind::kMaster) state.write_group_fp32(u, Kind::kParam, g, values);
        }
        std::fill(values.begin(), values.end(), 0.0f);
        state.write_group_fp32(u, Kind::kGrad, g, values);
      });
    }
    state.finish_replace(progress);
  });
}

std::filesystem::path store_model_path(const EngineState& state) {
  return std::filesystem::path(state.config().tiers.nvme.paths.front()) /
         fmt::format("strata-rank{}.model.json", state.rank());
}

void record_or_check_store_model(EngineState& state, bool resume) {
  const std::filesystem::path path = store_model_path(state);
  if (!resume) {
    nlohmann::json manifest;
    describe_model(state, manifest);
    io::write_file_atomically(path, manifest.dump(1));
    return;
  }
  if (!std::filesystem::exists(path)) return;  // a store from before the sidecar: its own checks
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (manifest.at("ranks").get<std::uint32_t>() != state.ranks()) {
      throw CheckpointMismatch(fmt::format(
          "the NVMe store at {} was written by {} ranks; this run has {} (resume with the same "
          "rank count, or load a checkpoint, which reshards)",
          path.parent_path().string(), manifest.at("ranks").dump(), state.ranks()));
    }
    validate_model(state, manifest, "the NVMe store at " + path.parent_path().string());
  } catch (const nlohmann::json::exception& error) {
    throw CheckpointCorruption(fmt::format("NVMe store model description {} is malformed: {}",
                                           path.string(), error.what()));
  }
}

std::string describe_stored_model(const EngineState& state) {
  const std::filesystem::path path = store_model_path(state);
  try {
    if (!std::filesystem::exists(path)) return fmt::format("no model description ({} missing)", path.string());
    const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
    const nlohmann::json manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
    const nlohmann::json& units = manifest.at("units");
    std::uint64_t params = 0;
    for (const nlohmann::json& unit : units) params += unit.at("numel").get<std::uint64_t>();
    return fmt::format("a model of {} units, {} parameters, {} optimizer, {} rank(s), first unit "
                       "\"{}\" ({})",
                       units.size(), params, manifest.at("optimizer").get<std::string>(),
                       manifest.at("ranks").get<std::uint32_t>(),
                       units.empty() ? std::string() : units.at(0).at("name").get<std::string>(),
                       path.filename().string());
  } catch (const std::exception& error) {
    return fmt::format("an unreadable model description ({}: {})", path.string(), error.what());
  }
}

std::vector<UnitSpec> unit_specs(const EngineState& state) {
  std::vector<UnitSpec> specs;
  for (const UnitState& unit : state.units()) specs.push_back(unit.spec);
  return specs;
}

// Runs `body` unless an earlier call failed, keeping the first error: work interleaved with
// collectives cannot leave the loop on one rank alone, so it records the error, goes on taking
// part in the collectives, and rethrows once every rank has finished (collectively()).
class DeferredError {
 public:
  template <typename Body>
  void run(Body&& body) {
    if (error_) return;
    try {
      body();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
};

// Streamed: for each sub-group index g of each unit, every rank reads its sub-group g of the
// master and the ranks all-gather them; rank 0 writes each rank's piece at its place in the file
// (rank r's piece is unit elements [r * shard + g.begin, ...)). Staging: one sub-group per rank
// plus this rank's own, on every rank.
void export_safetensors(EngineState& state, const std::filesystem::path& file, DType dtype) {
  STRATA_ASSERT(state.finalized(), "export before finalize");
  const std::uint32_t ranks = state.ranks();
  const bool writes = state.rank() == 0;
  std::optional<SafetensorsWriter> writer;
  collectively(state.comm(), "safetensors export (header)", [&] {
    if (!writes) return;
    writer.emplace(
        file, unit_specs(state), dtype,
        std::map<std::string, std::string>{{"format", "pt"},
                                           {"producer", "strata"},
                                           {"step", std::to_string(state.progress().step)}},
        /*prefix_unit_names=*/true);
  });
  const std::uint64_t group_max = state.largest_group_numel();
  StreamStaging mine(state.staging_meter(), group_max);
  StreamStaging gathered(state.staging_meter(), ranks > 1 ? ranks * group_max : 0);
  DeferredError error;
  for (UnitId u = 0; u < state.units().size(); ++u) {
    const UnitState& unit = state.units()[u];
    for (std::size_t g = 0; g < unit.groups.size(); ++g) {
      const SubGroup& sub = unit.groups[g];
      const std::span<float> own = mine.first(sub.numel);
      error.run([&] { state.read_group_fp32(u, Kind::kMaster, g, own); });
      std::span<float> all = own;
      if (ranks > 1) {
        all = gathered.first(ranks * sub.numel);
        state.all_gather_host(comm::ConstBuffer::of(std::span<const float>(own)),
                              comm::MutableBuffer::of(all));
      }
      if (!writes) continue;
      error.run([&] {
        for (std::uint32_t r = 0; r < ranks; ++r) {
          const std::uint64_t first = r * unit.layout.shard_numel + sub.begin;
          if (first >= unit.layout.numel) break;
          const std::uint64_t real = std::min(sub.numel, unit.layout.numel - first);
          writer->write(u, first, all.subspan(r * sub.numel, real));
        }
      });
    }
  }
  collectively(state.comm(), "safetensors export", [&] {
    error.rethrow();
    if (writes) writer->commit();
  });
}

// Every rank checks the header, then reads only its own shard's elements, a sub-group at a time.
void import_safetensors(EngineState& state, const std::filesystem::path& file) {
  STRATA_ASSERT(state.finalized(), "import before finalize");
  const std::vector<UnitSpec> specs = unit_specs(state);
  std::optional<SafetensorsReader> reader;
  collectively(state.comm(), "safetensors import", [&] {
    reader.emplace(SafetensorsReader::open(file));
    check_model_tensors(*reader, specs, /*prefix_unit_names=*/true);
  });
  StreamStaging staging(state.staging_meter(), state.largest_group_numel());
  state.begin_replace();
  collectively(state.comm(), "safetensors import (writing state)", [&] {
    for (UnitId u = 0; u < state.units().size(); ++u) {
      for_each_group(state, u, staging, [&](std::size_t g, std::span<float> values,
                                            std::uint64_t first, std::uint64_t real) {
        std::fill(values.begin(), values.end(), 0.0f);
        read_unit_range(*reader, specs[u], first, values.first(real), /*prefix_unit_names=*/true);
        state.write_group_fp32(u, Kind::kMaster, g, values);
        state.write_group_fp32(u, Kind::kParam, g, values);
        std::fill(values.begin(), values.end(), 0.0f);
        for (Kind kind : {Kind::kExpAvg, Kind::kExpAvgSq, Kind::kGrad}) {
          state.write_group_fp32(u, kind, g, values);
        }
      });
    }
    state.finish_replace({0, state.progress().loss_scale, 0});
  });
}

}  // namespace strata::runtime::detail
