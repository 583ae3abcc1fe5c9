# Sourced by bench-finetune.sh and bench-overlap.sh: the strata-finetune they run, a scratch
# folder, one run of a config per round, and the median ratios of tokens/s to a baseline.
#   FINETUNE  strata-finetune to run (default: build the release preset's)
#   STEPS     optimizer steps per run (default 10); ROUNDS  rounds of every config (default 3)
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

# run_config NAME TOML ROUND: one run, its log and summary JSON as $out/NAME.ROUND.{log,json}.
run_config() {
  "$finetune" --config "$2" --steps "$steps" --eval-every 0 --eval-batches 2 --overwrite \
    --summary-json "$out/$1.$3.json" >"$out/$1.$3.log" 2>&1 || { cat "$out/$1.$3.log"; exit 1; }
}

# print_median_ratios BASELINE CONFIG...: each config's tokens/s over the baseline's, per round
# (the runs of one round saw the same load), and their median; then the same for CPU seconds per
# step (the process's user + system time over the steps). Where the cores are all busy (the
# "cores busy" figure near the core count), tokens/s can only fall as the CPU per step rises: a
# placement's extra CPU (I/O submission, checksums, copies) is then the bound on its ratio.
print_median_ratios() {
  python3 - "$out" "$rounds" "$@" <<'PY'
import json, os, statistics, sys
out, rounds, baseline, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
summary = lambda c, r: json.load(open(f"{out}/{c}.{r}.json"))
for config in configs:
    ratios = [summary(config, r)["tokens_per_s"] / summary(baseline, r)["tokens_per_s"]
              for r in range(1, rounds + 1)]
    cpu = [summary(config, r)["cpu_s_per_step"] / summary(baseline, r)["cpu_s_per_step"]
           for r in range(1, rounds + 1)]
    print(f"{config:<28} / {baseline}: median {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)}); "
          f"CPU per step {statistics.median(cpu):.3f}x")
busy = [summary(c, r)["cores_busy"] for c in [baseline] + configs for r in range(1, rounds + 1)]
print(f"cores busy during the steps: {min(busy):.2f}-{max(busy):.2f} of {os.cpu_count()}")
PY
}
