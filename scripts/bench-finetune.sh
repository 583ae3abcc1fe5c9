#!/usr/bin/env bash
# Tokens/s of the fine-tuning example under each placement config, side by side: the configs run
# in turn ROUNDS times (default 3), so load from elsewhere falls on all alike, then the median
# ratio of each to all_device (#18's target for params_optimizer_nvme: >= 0.97). STEPS (default
# 10) optimizer steps per run; the same seed gives the same losses under all.
#   scripts/bench-finetune.sh            # builds the release preset first
#   FINETUNE=build/ci/examples/finetune/strata-finetune ROUNDS=3 scripts/bench-finetune.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-10}
rounds=${ROUNDS:-3}
finetune=${FINETUNE:-}
if [[ -z "$finetune" ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$(nproc)" --target strata-finetune >/dev/null
  finetune=./build/release/examples/finetune/strata-finetune
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
configs=(all_device optimizer_host optimizer_nvme params_optimizer_nvme)
printf '%-6s %-28s %-22s %9s %10s %10s %12s %14s\n' round config "params/grads/optimizer" \
  tokens/s "val loss" "RSS MiB" "NVMe GB/step" "load average"
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    "$finetune" --config "examples/configs/$config.toml" --steps "$steps" --eval-every 0 \
      --eval-batches 2 --overwrite --summary-json "$out/$config.$round.json" \
      >"$out/$config.$round.log" 2>&1 || { cat "$out/$config.$round.log"; exit 1; }
    load=$(cut -d' ' -f1 /proc/loadavg)
    python3 - "$out/$config.$round.json" "$config" "$steps" "$load" "$round" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); p = s["placement"]; steps = int(sys.argv[3])
nvme = (s["nvme_read_bytes"] + s["nvme_written_bytes"]) / steps / 1e9
print(f'{sys.argv[5]:<6} {sys.argv[2]:<28} {p["params"] + "/" + p["grads"] + "/" + p["optimizer"]:<22} '
      f'{s["tokens_per_s"]:9.0f} {s["final_val_loss"]:10.4f} {s["peak_rss_bytes"] / 2**20:10.0f} '
      f'{nvme:12.2f} {sys.argv[4]:>14}')
PY
  done
done
python3 - "$out" "$rounds" "${configs[@]}" <<'PY'
import json, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tps = lambda c, r: json.load(open(f"{out}/{c}.{r}.json"))["tokens_per_s"]
for config in configs[1:]:
    ratios = [tps(config, r) / tps("all_device", r) for r in range(1, rounds + 1)]
    print(f"{config:<28} / all_device: median {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
PY
