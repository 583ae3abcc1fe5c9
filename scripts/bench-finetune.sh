#!/usr/bin/env bash
# Tokens/s of the fine-tuning example under each placement config, side by side: the configs run
# in turn ROUNDS times (default 3), so load from elsewhere falls on all alike, then the median
# ratio of each to all_device (#18's target for params_optimizer_nvme: >= 0.97). STEPS (default
# 10) optimizer steps per run; the same seed gives the same losses under all.
#   scripts/bench-finetune.sh            # builds the release preset first
#   FINETUNE=build/ci/examples/finetune/strata-finetune ROUNDS=3 scripts/bench-finetune.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-finetune-common.sh
configs=(all_device optimizer_host optimizer_nvme params_optimizer_nvme)
printf '%-6s %-28s %-22s %9s %10s %10s %12s %12s %14s\n' round config "params/grads/optimizer" \
  tokens/s "val loss" "RSS MiB" "NVMe GB/step" "CPU s/step" "load average"
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    run_config "$config" "examples/configs/$config.toml" "$round"
    load=$(cut -d' ' -f1 /proc/loadavg)
    python3 - "$out/$config.$round.json" "$config" "$steps" "$load" "$round" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); p = s["placement"]; steps = int(sys.argv[3])
nvme = (s["nvme_read_bytes"] + s["nvme_written_bytes"]) / steps / 1e9
print(f'{sys.argv[5]:<6} {sys.argv[2]:<28} {p["params"] + "/" + p["grads"] + "/" + p["optimizer"]:<22} '
      f'{s["tokens_per_s"]:9.0f} {s["final_val_loss"]:10.4f} {s["peak_rss_bytes"] / 2**20:10.0f} '
      f'{nvme:12.2f} {s["cpu_s_per_step"]:12.2f} {sys.argv[4]:>14}')
PY
  done
done
print_median_ratios all_device "${configs[@]:1}"
