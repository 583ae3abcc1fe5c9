#!/usr/bin/env bash
# Step time against bytes moved: `strata bench step` with fp32 optimizer state and with int8
# moments + a bf16 master ([optimizer] state_dtype = "int8", master_dtype = "bf16"), params, grads
# and optimizer on NVMe, alternated ROUNDS times in one session so both see the same machine
# noise. Prints each run, then the medians and the ratios (compressed / fp32) of step time, the
# I/O-only step, Adam alone (the fused compressed update) and NVMe bytes per step. docs/benchmarks.md's
# throughput section quotes its output.
#   STRATA=build/nocuda/runtime/strata PARAMS=3e7 STEPS=3 ROUNDS=3 scripts/bench-compressed-step.sh
set -euo pipefail

STRATA=${STRATA:-build/release/runtime/strata}
PARAMS=${PARAMS:-3e7}
STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-3}
NVME_DIR=${NVME_DIR:-/var/tmp/strata-bench-compressed}

if [[ ! -x "$STRATA" ]]; then
  echo "bench-compressed-step: STRATA=$STRATA is not an executable (build the strata target)" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work" "$NVME_DIR"' EXIT

# The placement of the `strata bench step` rows of docs/benchmarks.md; only [optimizer]'s formats differ.
write_config() {  # name, extra [optimizer] lines
  cat >"$work/$1.toml" <<EOF
[tiers.device]
kind = "host"
budget = "1GiB"
[tiers.host]
budget = "2GiB"
[tiers.nvme]
paths = ["$NVME_DIR/$1"]
budget = "64GiB"
[zero]
stage = 3
params = "nvme"
grads = "nvme"
optimizer = "nvme"
sub_group_size = 4e6
buffer_count = 4
[optimizer]
type = "adamw"
$2
[precision]
params = "bf16"
grads = "bf16"
EOF
}
write_config fp32 ''
write_config int8 $'state_dtype = "int8"\nmaster_dtype = "bf16"'

for ((round = 1; round <= ROUNDS; ++round)); do
  for kind in fp32 int8; do
    "$STRATA" bench step "$work/$kind.toml" --params "$PARAMS" --steps "$STEPS" --json \
        --overwrite >"$work/$kind.$round.json"
    rm -rf "${NVME_DIR:?}/$kind"
  done
done

/usr/bin/python3 - "$work" "$ROUNDS" "$PARAMS" <<'EOF'
import json, statistics, sys
work, rounds, params = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {kind: [json.load(open(f"{work}/{kind}.{r}.json")) for r in range(1, rounds + 1)]
        for kind in ("fp32", "int8")}
for r in range(rounds):
    print("round {}: ".format(r + 1) + ", ".join(
        "{} t_step {:.3f} s t_io {:.3f} s t_adam {:.3f} s NVMe {:.3f} GB".format(
            kind, runs[kind][r]["t_step_s"], runs[kind][r]["t_io_s"], runs[kind][r]["t_adam_s"],
            runs[kind][r]["nvme_bytes_per_step"] / 1e9) for kind in ("fp32", "int8")))
med = {kind: {key: statistics.median(run[key] for run in runs[kind])
              for key in ("t_step_s", "t_io_s", "t_adam_s", "nvme_bytes_per_step")}
       for kind in runs}
for kind in ("fp32", "int8"):
    m = med[kind]
    print("{} state: median t_step {:.3f} s, t_io {:.3f} s, t_adam {:.3f} s, NVMe {:.3f} GB per "
          "step".format(kind, m["t_step_s"], m["t_io_s"], m["t_adam_s"],
                        m["nvme_bytes_per_step"] / 1e9))
print("int8 moments + bf16 master / fp32, {} params: step time {:.3f}x, I/O-only step {:.3f}x, "
      "Adam alone {:.3f}x, NVMe bytes per step {:.3f}x".format(
          params, med["int8"]["t_step_s"] / med["fp32"]["t_step_s"],
          med["int8"]["t_io_s"] / med["fp32"]["t_io_s"],
          med["int8"]["t_adam_s"] / med["fp32"]["t_adam_s"],
          med["int8"]["nvme_bytes_per_step"] / med["fp32"]["nvme_bytes_per_step"]))
EOF
