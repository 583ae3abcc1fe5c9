#!/usr/bin/env bash
# The largest Llama-architecture model that each placement of examples/configs/h200/ fits on one
# H200 (130 GiB device budget), 128 GiB of host memory (110 GiB budget) and one NVMe drive, as
# `strata plan` counts it: docs/benchmarks.md, "One H200: the largest model per placement".
# `strata plan --model DIR` reads only DIR/config.json, so each shape is a folder holding just
# that file (the published Llama 2 / 3.x / Code Llama shapes, and gpu-check's 1.08 B folder): no
# weights are written, and no GPU is needed (--device cuda charges the GPU's compute all the same).
# For each config, the shapes are tried from the largest down, each at seq 1024 with the knobs
# below in order; the first plan that fits (exit 0) is the row.
#   scripts/h200-plans.sh [STRATA]        (default build/nocuda/runtime/strata)
# Output: one Markdown table row per config, then each chosen plan in full. H200_PLANS_CONFIGS
# (config names) narrows the run.
set -euo pipefail
cd "$(dirname "$0")/.."
strata=${1:-build/nocuda/runtime/strata}
[[ -x $strata ]] || { echo "h200-plans: no strata program at $strata (build the nocuda preset's strata target)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seq_len=1024

# name hidden inner layers heads kv_heads vocab tied, largest first.
shapes=(
  "llama-3.1-70b 8192 28672 80 64 8 128256 false"
  "codellama-34b 8192 22016 48 64 8 32000 false"
  "llama-2-13b 5120 13824 40 40 40 32000 false"
  "llama-3.1-8b 4096 14336 32 32 8 128256 false"
  "llama-2-7b 4096 11008 32 32 32 32000 false"
  "llama-3.2-3b 3072 8192 28 24 8 128256 true"
  "llama-3.2-1b 2048 8192 16 32 8 128256 true"
  "gpu-check-1.08b 2048 5632 24 16 4 272 false"
)
# micro-batch and activation checkpointing, in order of preference: 8 x 1024 or 4 x 1024 tokens
# per micro-batch without recomputation first, then with it (one more forward per step) down to
# one sequence.
knobs=("8 off" "4 off" "8 on" "4 on" "2 on" "1 on")

for shape in "${shapes[@]}"; do
  read -r name hidden inner layers heads kv vocab tied <<<"$shape"
  mkdir -p "$work/$name"
  cat >"$work/$name/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $hidden,
 "intermediate_size": $inner, "num_hidden_layers": $layers, "num_attention_heads": $heads,
 "num_key_value_heads": $kv, "vocab_size": $vocab, "tie_word_embeddings": $tied,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "hidden_act": "silu", "torch_dtype": "bfloat16"}
EOF
done

gib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1073741824 }'; }
# A figure of the plan json $plan_json: a python3 expression over it, `p`.
field() { python3 -c "import json, sys; p = json.load(open(sys.argv[1])); print($1)" "$plan_json"; }
# Device bytes of the buffer rows whose purpose contains $1.
device_row() { field "sum(b['bytes'] for b in p['buffers'] if b['tier'] == 'device' and '$1' in b['purpose'])"; }
plan() {  # shape, micro-batch, checkpointing (on/off), then strata plan's own flags
  local model=$1 micro=$2 checkpointing=$3
  shift 3
  local flags=(--model "$work/$model" --device cuda --seq-len "$seq_len" --micro-batch "$micro")
  [[ $checkpointing == on ]] && flags+=(--activation-checkpointing)
  "$strata" plan "$path" "${flags[@]}" "$@"
}

echo "| config | largest model that fits | params | micro-batch x seq, checkpointing | device: state + compute + unit cache / budget | host / budget | NVMe / budget | NVMe read / write per step | PCIe h2d / d2h per step, bound at 25 GB/s each way | next shape up (1 x $seq_len, checkpointing) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
plans=()
for config in ${H200_PLANS_CONFIGS:-all_device optimizer_host params_optimizer_host optimizer_nvme all_nvme}; do
  path="examples/configs/h200/$config.toml"
  plan_json="$work/$config.json"
  found=-1
  for index in "${!shapes[@]}"; do
    read -r name _ <<<"${shapes[$index]}"
    for knob in "${knobs[@]}"; do
      read -r micro checkpointing <<<"$knob"
      if plan "$name" "$micro" "$checkpointing" --json >"$plan_json" 2>/dev/null; then
        found=$index
        break 2
      fi
    done
  done
  if ((found < 0)); then
    echo "| \`$config\` | none of the shapes fits | | | | | | | | |"
    continue
  fi
  plan "$name" "$micro" "$checkpointing" >"$work/$config.txt" || true
  plans+=("$config")
  tier() { gib "$(field "p['tiers']['$1']['$2']")"; }
  state=$(tier device state_bytes)
  compute=$(gib "$(device_row "compute on the GPU")")
  cache=$(gib "$(device_row "gathered units")")
  scratch=$(gib "$(device_row "gradient scratch")")
  next="(the largest shape)"
  if ((found > 0)); then
    read -r larger _ <<<"${shapes[$((found - 1))]}"
    plan_json="$work/$config-larger.json"
    plan "$larger" 1 on --json >"$plan_json" 2>/dev/null || true
    next="$larger: $(field "'; '.join(f'{t} short by {v[\"short_bytes\"] / 2**30:.1f} GiB' for t, v in p['tiers'].items() if not v['fits'])")"
    plan_json="$work/$config.json"
  fi
  echo "| \`$config\` | $name | $(awk -v n="$(field 'p["params"]')" 'BEGIN { printf "%.2f B", n / 1e9 }') |" \
    "$micro x $seq_len, $checkpointing |" \
    "$state + $compute + $cache (+ $scratch gradient scratch) = $(tier device total_bytes) / $(tier device budget_bytes) GiB |" \
    "$(tier host total_bytes) / $(tier host budget_bytes) GiB |" \
    "$(tier nvme total_bytes) / $(tier nvme budget_bytes) GiB |" \
    "$(field 'round(p["nvme_read_bytes_per_step"] / 1e9, 1)') / $(field 'round(p["nvme_write_bytes_per_step"] / 1e9, 1)') GB |" \
    "$(field 'round(p["pcie"]["h2d_bytes_per_step"] / 1e9, 1)') / $(field 'round(p["pcie"]["d2h_bytes_per_step"] / 1e9, 1)') GB, >= $(field 'round(p["pcie"]["bound_s"], 2)') s |" \
    "$next |"
done
for config in "${plans[@]}"; do
  echo
  echo "== $config"
  sed "s|$work/||" "$work/$config.txt"
done
