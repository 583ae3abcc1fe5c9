#!/usr/bin/env bash
# The overlapped step, side by side: fine-tuning tokens/s with params and optimizer state on NVMe,
# [zero] overlap_optimizer on and off, and defer_update on (the step's updates run under the next
# forward, which takes their parameters instead of reading them), against everything in device
# memory, the configs alternated ROUNDS times (default 3) so load from elsewhere falls on all
# alike. Prints each run with its NVMe bytes per step, then the median ratios to all-device
# (#18's target: >= 0.97 with the overlap).
#   FINETUNE=build/nocuda/examples/finetune/strata-finetune STEPS=10 ROUNDS=3 scripts/bench-overlap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-finetune-common.sh
cp examples/configs/all_device.toml "$out/all_device.toml"
# The NVMe config as shipped ([zero] defer_update = true), and with the step's updates in step():
# during the backward (overlap_optimizer, the default) or after it.
cp examples/configs/params_optimizer_nvme.toml "$out/nvme_defer.toml"
grep -q '^defer_update = true' "$out/nvme_defer.toml" || { echo "no defer_update key" >&2; exit 1; }
sed 's/^defer_update = true/defer_update = false/' "$out/nvme_defer.toml" >"$out/nvme_overlap.toml"
sed 's/^\[zero\]$/[zero]\noverlap_optimizer = false/' "$out/nvme_overlap.toml" >"$out/nvme_serial.toml"
grep -q '^overlap_optimizer = false' "$out/nvme_serial.toml" || { echo "no [zero] table" >&2; exit 1; }
# Both without clipping (grad_clip = 0): early in this fine-tune every step clips at 1.0, and a
# step after a clipped one runs serially, so these two show what the overlap itself hides.
for config in nvme_overlap nvme_serial nvme_defer; do
  sed 's/^grad_clip = .*/grad_clip = 0.0/' "$out/$config.toml" >"$out/${config}_noclip.toml"
  grep -q '^grad_clip = 0.0' "$out/${config}_noclip.toml" || { echo "no grad_clip key" >&2; exit 1; }
done
configs=(all_device nvme_overlap nvme_serial nvme_defer nvme_overlap_noclip nvme_serial_noclip
         nvme_defer_noclip)
printf '%-6s %-20s %9s %10s %18s %22s\n' round config tokens/s "val loss" "optimizer exposed" \
  "NVMe read/written"
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    run_config "$config" "$out/$config.toml" "$round"
    exposed=$(grep -o 'optimizer exposed [0-9.]*' "$out/$config.$round.log" |
              awk '{s += $3; n++} END {printf "%.2f s/step", n ? s / n : 0}')
    python3 - "$out/$config.$round.json" "$round" "$config" "$exposed" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
# Bytes per step, validation reads included (the same batches in every config).
io = f'{s["nvme_read_bytes"] / s["steps"] / 1e6:.0f} / {s["nvme_written_bytes"] / s["steps"] / 1e6:.0f} MB'
print(f'{sys.argv[2]:<6} {sys.argv[3]:<20} {s["tokens_per_s"]:9.0f} {s["final_val_loss"]:10.4f} '
      f'{sys.argv[4]:>18} {io:>22}')
PY
  done
done
print_median_ratios all_device "${configs[@]:1}"
