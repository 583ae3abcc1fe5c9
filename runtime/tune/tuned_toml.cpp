#include "runtime/tune/tuned_toml.hpp"

#include <cmath>
#include <tuple>

#include <fmt/format.h>

#include "base/units.hpp"

namespace strata::runtime::tune {
namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Exact binary sizes as the size strings docs/config.md lists, anything else in bytes.
std::string size_value(std::uint64_t bytes) {
  for (const auto& [unit, name] : {std::pair{kGiB * 1024, "TiB"}, std::pair{kGiB, "GiB"},
                                   std::pair{kMiB, "MiB"}, std::pair{kKiB, "KiB"}}) {
    if (bytes >= unit && bytes % unit == 0) return toml_string(fmt::format("{}{}", bytes / unit, name));
  }
  return fmt::format("{}", bytes);
}

// The shortest text that reads back as the same double, always a TOML float.
std::string float_value(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // "n": inf, nan
  return text;
}

std::string bool_value(bool value) { return value ? "true" : "false"; }

class Writer {
 public:
  explicit Writer(const TomlComments& comments) : comments_(comments) {}

  void section(std::string name) {
    if (!out_.empty()) out_ += "\n";
    out_ += "[" + name + "]\n";
    section_ = std::move(name);
  }
  void key(std::string_view name, const std::string& value) {
    std::string line = fmt::format("{} = {}", name, value);
    const std::string path = section_ + "." + std::string(name);
    for (const auto& [key, comment] : comments_.keys) {
      if (key == path) line = fmt::format("{:<32} # {}", line, comment);
    }
    out_ += line + "\n";
  }
  // A key whose value the reader would refuse here, kept visible as a comment.
  void commented_key(std::string_view name, const std::string& value, std::string_view why) {
    out_ += fmt::format("# {} = {}   ({})\n", name, value, why);
  }
  std::string finish() {
    std::string head;
    for (const std::string& line : comments_.header) head += "# " + line + "\n";
    return head + (head.empty() ? "" : "\n") + out_;
  }

 private:
  const TomlComments& comments_;
  std::string section_;
  std::string out_;
};

void write_tiers(Writer& w, const TiersConfig& tiers) {
  w.section("tiers.device");
  w.key("kind", toml_string(tiers::device_kind_name(tiers.device.kind)));
  w.key("index", fmt::format("{}", tiers.device.index));
  w.key("budget", size_value(tiers.device.budget_bytes));
  w.section("tiers.host");
  w.key("budget", size_value(tiers.host.budget_bytes));
  w.key("pinned", bool_value(tiers.host.pinned));
  w.key("nvme_read_cache", bool_value(tiers.host.nvme_read_cache));
  w.section("tiers.nvme");
  std::string paths = "[";
  for (std::size_t i = 0; i < tiers.nvme.paths.size(); ++i) {
    paths += (i == 0 ? "" : ", ") + toml_string(tiers.nvme.paths[i]);
  }
  w.key("paths", paths + "]");
  w.key("budget", size_value(tiers.nvme.budget_bytes));
  w.key("block_size", size_value(tiers.nvme.block_size));
  w.key("queue_depth", fmt::format("{}", tiers.nvme.queue_depth));
  w.key("rings", fmt::format("{}", tiers.nvme.rings));
  w.key("direct", bool_value(tiers.nvme.direct));
  w.key("engine", toml_string(to_string(tiers.nvme.engine)));
  w.key("fsync", bool_value(tiers.nvme.fsync));
  w.key("on_existing", toml_string(to_string(tiers.nvme.on_existing)));
}

void write_zero(Writer& w, const ZeroConfig& zero) {
  w.section("zero");
  w.key("stage", fmt::format("{}", zero.stage));
  w.key("params", toml_string(to_string(zero.params)));
  w.key("grads", toml_string(to_string(zero.grads)));
  w.key("optimizer", toml_string(to_string(zero.optimizer)));
  w.key("sub_group_size", fmt::format("{}", zero.sub_group_size));
  for (const auto& [key, kind, fraction, home] :
       {std::tuple{"optimizer_host_fraction", "optimizer", zero.optimizer_host_fraction,
                   zero.optimizer},
        std::tuple{"params_host_fraction", "params", zero.params_host_fraction, zero.params},
        std::tuple{"grads_host_fraction", "grads", zero.grads_host_fraction, zero.grads}}) {
    if (home == Tier::kNvme) {
      w.key(key, float_value(fraction));
    } else {
      w.commented_key(key, "0.0", fmt::format("{} = \"nvme\" only", kind));
    }
  }
  if (zero.optimizer != Tier::kDevice && zero.params == Tier::kDevice &&
      zero.grads == Tier::kDevice) {
    w.key("optimizer_device_fraction", float_value(zero.optimizer_device_fraction));
  } else {
    w.commented_key("optimizer_device_fraction", "0.0",
                    "optimizer on host or nvme, params and grads on device");
  }
  w.key("prefetch_depth", fmt::format("{}", zero.prefetch_depth));
  w.key("buffer_count", fmt::format("{}", zero.buffer_count));
  w.key("persistence_threshold", fmt::format("{}", zero.persistence_threshold));
  w.key("max_inflight_bytes", size_value(zero.max_inflight_bytes));
  w.key("overlap_optimizer", bool_value(zero.overlap_optimizer));
  w.key("defer_update", bool_value(zero.defer_update));
}

void write_optimizer(Writer& w, const OptimizerConfig& o) {
  w.section("optimizer");
  w.key("type", toml_string(to_string(o.type)));
  w.key("lr", float_value(o.lr));
  w.key("betas", fmt::format("[{}, {}]", float_value(o.beta1), float_value(o.beta2)));
  w.key("eps", float_value(o.eps));
  w.key("weight_decay", float_value(o.weight_decay));
  w.key("bias_correction", bool_value(o.bias_correction));
  w.key("grad_clip", float_value(o.grad_clip));
  w.key("threads", fmt::format("{}", o.threads));
  w.key("warmup_steps", fmt::format("{}", o.warmup_steps));
  w.key("schedule", toml_string(to_string(o.schedule)));
  if (o.schedule == LrScheduleKind::kConstant) {
    w.commented_key("lr_decay_steps", "0", "linear and cosine schedules only");
    w.commented_key("min_lr", "0.0", "linear and cosine schedules only");
  } else {
    w.key("lr_decay_steps", fmt::format("{}", o.lr_decay_steps));
    w.key("min_lr", float_value(o.min_lr));
  }
  w.key("state_dtype", toml_string(cpu_adam::state_dtype_name(o.state_dtype)));
  w.key("master_dtype", toml_string(cpu_adam::state_dtype_name(o.master_dtype)));
  if (o.master_dtype == cpu_adam::StateDType::kBf16) {
    w.key("master_rounding", toml_string(to_string(o.master_rounding)));
  } else {
    w.commented_key("master_rounding", "\"stochastic\"", "bf16 master only");
  }
}

void write_rest(Writer& w, const Config& c) {
  w.section("precision");
  w.key("params", toml_string(to_string(c.precision.params)));
  w.key("grads", toml_string(to_string(c.precision.grads)));
  w.key("reduce_dtype", toml_string(c.precision.reduce_dtype ? to_string(*c.precision.reduce_dtype)
                                                               : std::string_view("auto")));
  w.key("dynamic_loss_scale", bool_value(c.precision.dynamic_loss_scale));
  w.key("loss_scale", float_value(c.precision.loss_scale));
  w.key("loss_scale_window", fmt::format("{}", c.precision.loss_scale_window));
  w.key("min_loss_scale", float_value(c.precision.min_loss_scale));
  w.section("checkpoint");
  w.key("dir", toml_string(c.checkpoint.dir));
  w.key("interval_steps", fmt::format("{}", c.checkpoint.interval_steps));
  w.key("keep", fmt::format("{}", c.checkpoint.keep));
  w.section("trace");
  w.key("path", toml_string(c.trace.path));
  w.section("model");
  w.key("params", fmt::format("{}", c.model.params));
  w.key("layers", fmt::format("{}", c.model.layers));
  w.key("d_model", fmt::format("{}", c.model.d_model));
  w.key("heads", fmt::format("{}", c.model.heads));
  w.key("seq_len", fmt::format("{}", c.model.seq_len));
  w.key("vocab", fmt::format("{}", c.model.vocab));
  w.key("tied_head", bool_value(c.model.tied_head));
  w.key("micro_batch", fmt::format("{}", c.model.micro_batch));
  w.key("grad_accumulation", fmt::format("{}", c.model.grad_accumulation));
}

}  // namespace

std::string render_config_toml(const Config& config, const TomlComments& comments) {
  Writer w(comments);
  w.section("run");
  w.key("ranks", fmt::format("{}", config.run.ranks));
  w.key("seed", fmt::format("{}", config.run.seed));
  write_tiers(w, config.tiers);
  w.section("comm");
  w.key("backend", toml_string(to_string(config.comm.backend)));
  write_zero(w, config.zero);
  write_optimizer(w, config.optimizer);
  write_rest(w, config);
  return w.finish();
}

}  // namespace strata::runtime::tune
