#!/usr/bin/env bash
# Tokens/s of the fine-tuning example under each placement config, in one run, side by side.
# STEPS (default 10) optimizer steps per config; the same seed gives the same losses under all.
#   scripts/bench-finetune.sh            # builds the release preset first
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-10}
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata-finetune >/dev/null
finetune=./build/release/examples/finetune/strata-finetune
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-28s %-22s %9s %10s %10s %12s %14s\n' config "params/grads/optimizer" tokens/s "val loss" "RSS MiB" "NVMe GB/step" "load average"
for config in all_device optimizer_host optimizer_nvme params_optimizer_nvme; do
  "$finetune" --config "examples/configs/$config.toml" --steps "$steps" --eval-every 0 \
    --eval-batches 2 --summary-json "$out/$config.json" >"$out/$config.log" 2>&1 ||
    { cat "$out/$config.log"; exit 1; }
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$out/$config.json" "$config" "$steps" "$load" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); p = s["placement"]; steps = int(sys.argv[3])
nvme = (s["nvme_read_bytes"] + s["nvme_written_bytes"]) / steps / 1e9
print(f'{sys.argv[2]:<28} {p["params"] + "/" + p["grads"] + "/" + p["optimizer"]:<22} '
      f'{s["tokens_per_s"]:9.0f} {s["final_val_loss"]:10.4f} {s["peak_rss_bytes"] / 2**20:10.0f} '
      f'{nvme:12.2f} {sys.argv[4]:>14}')
PY
done
