#!/usr/bin/env bash
# Everything strata checks on an NVIDIA GPU, in one run (about 6 minutes on one H200), against
# PyTorch on the same machine. Made for a GPU machine without internet and without strata's
# dependencies: build the bundle where they are (scripts/gpu-bundle.sh), carry the checkout with
# .gpu-bundle/ to the GPU machine, run this there. Without a bundle it builds from source, which
# needs scripts/install-deps.sh's packages.
#
# Sections, in the order they run (GPU_CHECK_ONLY="tests bench" runs a subset):
#  tests      every CUDA test of every suite (filter *Cuda*:*cuda*:*Nccl*); fails if any skips
#  bench      pinned h2d/d2h GB/s, `strata bench step --device cuda` (optimizer on host and NVMe),
#             the GPU optimizer and attention kernels' timings where this build has them, and the
#             bf16 decoder's element-wise, norm and loss kernels' GB/s against a device copy
#  llama      a 1.08 B Llama folder (hidden 2048, 24 layers, 16/4 heads, inner 5632), seq 1024 x 8:
#             strata all on the GPU and optimizer on the host, next to PyTorch + transformers
#             (sdpa, bf16 autocast, fused AdamW, all on the GPU) and FSDP2 + CPUOffloadPolicy
#             (bf16 MixedPrecisionPolicy, AdamW on the CPU): tokens/s, TFLOPS, MFU, ratios;
#             all on the GPU again with --synchronous-unit-calls, for what the asynchronous unit
#             calls gain (GPU_CHECK_SYNC_AB=0 skips it)
#  losses     the same 1.08 B folder, seq 256 x 2, 5 steps on cuda: the losses to set beside the
#             host device's (the same command with --device host) and PyTorch's
#  export     a 90 M Llama folder fine-tuned 2 steps on cuda with --export; transformers loads the
#             export, its logits on strata-eval's first window and the tokenizers library's ids
#             against strata's
#  agreement  that 90 M folder fine-tuned 20 steps (seq 256 x 4, all state on the device) with the
#             same config, seed and data on cuda and on the host device: fails if any step's loss
#             is more than 1% from the host's (scripts/compare-step-losses.py)
#  gpt        the built-in 25 M GPT, three placements, on cuda and on the host device
#  sanitizer  compute-sanitizer memcheck on the CUDA tests of the kernels, racecheck on kernels
# GPU_CHECK_SUITES, GPU_CHECK_FILTER, GPU_CHECK_PLACEMENTS, GPU_CHECK_TORCH, GPU_CHECK_STEPS and
# GPU_CHECK_AGREEMENT narrow a run to what a short lease allows (see below).
# GPU_CHECK_DEVICE=host runs the same script on a machine without a GPU (the host-emulated
# device; no sanitizer; CUDA tests may skip; the PyTorch parts run only where python3 has torch
# and transformers), and GPU_CHECK_LLAMA="hidden inner layers heads kv_heads" shrinks the Llama
# folder: that is how the script itself is tested without a GPU. GPU_CHECK_BUILD=build/nocuda takes
# the binaries and test suites from that existing build instead of the bundle or a build of its own
# (it must hold the targets the chosen sections run).
# Output: the log, then one "gpu-check: <figure>" line per figure; with $OUT set (the lent
# machine's return folder) the log and the summary are written there too. Exit status 1 when any
# section failed (the others still ran). GPU_PEAK_TFLOPS (default 989, H100/H200 SXM bf16 dense)
# is the MFU's denominator.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out_dir=${OUT:-$(mktemp -d)}
mkdir -p "$out_dir"
exec > >(tee "$out_dir/gpu-check.log") 2>&1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
peak_tflops=${GPU_PEAK_TFLOPS:-989}
only=" ${GPU_CHECK_ONLY:-tests bench llama losses export agreement gpt sanitizer} "
summary_file="$out_dir/summary.txt"
: >"$summary_file"
failed=()
note() { echo "gpu-check: $*" | tee -a "$summary_file"; }
fail() { failed+=("$1"); note "FAILED $*"; }
started=$SECONDS
# GPU_CHECK_SECONDS: sections that would start after this many seconds are skipped (and said so),
# so that a run under a time limit still writes its summary.
wanted() {
  [[ $only == *" $1 "* ]] || return 1
  local limit=${GPU_CHECK_SECONDS:-0}
  if ((limit > 0 && SECONDS - started > limit)); then
    note "section $1 skipped: past GPU_CHECK_SECONDS=$limit"
    return 1
  fi
}
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

device=${GPU_CHECK_DEVICE:-cuda}
read -r llama_hidden llama_inner llama_layers llama_heads llama_kv <<<"${GPU_CHECK_LLAMA:-2048 5632 24 16 4}"
if [[ $device == cuda ]]; then
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check here" >&2
    exit 2
  fi
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
else
  only=${only/ sanitizer / }
fi
have_torch() { python3 -c "import torch, transformers, tokenizers" 2>/dev/null; }

# --- The binaries: the bundle, or a build from source. ---
nvidia_libs=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | paste -sd:)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ -n ${GPU_CHECK_BUILD:-} ]]; then
  build=$GPU_CHECK_BUILD
  data_dir=/usr/share/common-licenses
elif [[ -f .gpu-bundle/manifest ]]; then
  cat .gpu-bundle/manifest
  build=$(awk -F= '$1 == "build_dir" {print $2}' .gpu-bundle/manifest)
  source_dir=$(awk -F= '$1 == "source_dir" {print $2}' .gpu-bundle/manifest)
  python3 - "$build" "$work/lib" <<'PY'
import sys, tarfile
for archive, dest in ((".gpu-bundle/bin.tar.xz", "."), (".gpu-bundle/lib.tar.xz", sys.argv[2])):
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(dest, filter="tar")
        except TypeError:  # Python before 3.11.4 has no extraction filters
            tar.extractall(dest)
PY
  export LD_LIBRARY_PATH="$work/lib:$LD_LIBRARY_PATH"
  # The tests find their fixtures through the source path they were compiled with.
  if [[ $source_dir != "$root" && ! -e $source_dir ]]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$root" "$source_dir"
  fi
  data_dir="$build/data/common-licenses"
else
  ./scripts/install-deps.sh
  build=build/gpu-check
  cmake --preset release -B "$build" -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null
  cmake --build "$build" -j "$(nproc)" --target strata strata-finetune strata-make-tiny-model \
    strata-eval strata-generate strata-attention-bench strata-kernel-bench strata_tiers_tests \
    strata_runtime_tests strata_gpt_tests strata_finetune_tests strata_llm_model_tests \
    strata_llm_tests || exit 1
  data_dir=/usr/share/common-licenses
fi
strata="$build/runtime/strata"
finetune="$build/examples/finetune/strata-finetune"
make_model="$build/examples/llm/strata-make-tiny-model"
suites=(tests/tiers/strata_tiers_tests tests/runtime/strata_runtime_tests
        tests/models/strata_gpt_tests tests/models/strata_finetune_tests
        tests/models/llm/strata_llm_model_tests tests/models/llm/strata_llm_tests)
cuda_filter='*Cuda*:*cuda*:*Nccl*'
# Narrower runs for a short lease: GPU_CHECK_SUITES (paths under the build), GPU_CHECK_FILTER,
# GPU_CHECK_PLACEMENTS (strata's 1.08 B runs; examples/configs names, h200/... included), GPU_CHECK_TORCH (PyTorch's), GPU_CHECK_STEPS,
# GPU_CHECK_AGREEMENT="steps seq micro_batch" (the agreement section's runs).
[[ -n ${GPU_CHECK_SUITES:-} ]] && read -r -a suites <<<"$GPU_CHECK_SUITES"
test_filter=${GPU_CHECK_FILTER:-$cuda_filter}
llama_steps=${GPU_CHECK_STEPS:-6}
read -r agreement_steps agreement_seq agreement_batch <<<"${GPU_CHECK_AGREEMENT:-20 256 4}"
json_number() { grep -o "\"$1\": *[0-9.e+-]*" "$2" | head -n 1 | sed 's/.*: *//'; }
# Median tokens/s of a strata-finetune log's step lines after the first (allocation, warm-up).
median_tokens() {
  awk -F'|' '/^step +[0-9]+ \| loss/ { n = $1; sub(/step +/, "", n); if (n + 0 < 2) next;
             t = $4; gsub(/[^0-9.]/, "", t); print t }' "$1" | sort -n |
    awk '{ v[NR] = $1 } END { if (!NR) print 0; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# TFLOPS and MFU of tokens/s for FLOP/token.
rate() { awk -v t="$1" -v f="$2" -v p="$peak_tflops" 'BEGIN { x = t * f / 1e12; printf "%.1f TFLOPS, MFU %.1f%%", x, 100 * x / p }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }
# A config from an example with the device and host budgets raised; the one-H200 configs
# (examples/configs/h200/*, sized for 141 GB + 128 GiB already) keep their budgets.
big_config() {  # example name (e.g. optimizer_host or h200/optimizer_host), output
  if [[ $1 == h200/* ]]; then
    sed "s|/var/tmp/strata-nvme|$work/nvme|" "examples/configs/$1.toml" >"$2"
    return
  fi
  sed -e 's/^budget = "8GiB"/budget = "64GiB"/' -e '0,/^budget = "64GiB"/s//budget = "120GiB"/' \
    -e "s|/var/tmp/strata-nvme|$work/nvme|" "examples/configs/$1.toml" >"$2"
}

# --- tests ---
if wanted tests; then
  stamp tests
  for suite in "${suites[@]}"; do
    log="$work/$(basename "$suite").log"
    timeout 200 "$build/$suite" --gtest_filter="$test_filter" --gtest_brief=1 >"$log" 2>&1
    status=$?
    tail -n 5 "$log"
    grep -E "^\[  (FAILED|SKIPPED) \]" "$log" | head -n 20
    passed=$(grep -oE "^\[  PASSED  \] [0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
    skipped=$(grep -oE "^\[  SKIPPED \] [0-9]+ test" "$log" | grep -oE "[0-9]+" || echo 0)
    if ((status != 0)); then
      grep -vE "^\[ +(OK|RUN) +\]" "$log" | head -c 12000
      fail "tests $(basename "$suite"): exit $status, $passed passed"
    elif ((skipped > 0)) && [[ $device == cuda ]]; then
      fail "tests $(basename "$suite"): $skipped skipped although a GPU is visible"
    else
      note "tests $(basename "$suite"): $passed CUDA tests passed, $skipped skipped"
    fi
    if grep -q "unreported error" "$log"; then fail "tests $(basename "$suite"): a stream error was never reported"; fi
  done
fi

# --- bench ---
if wanted bench; then
  stamp bench
  benches=${GPU_CHECK_BENCH:-device step attention kernels}  # a subset for a short lease
  if [[ $benches == *device* ]]; then
    "$strata" bench device --device "$device" --mib 256 --iterations 20 \
      --optimizer-params "$([[ $device == cuda ]] && echo 1.08e9 || echo 1e7)" | tee "$work/device.log"
    note "h2d pinned copy: $(awk '/^copy host->device/ {print $3}' "$work/device.log") GB/s (256 MiB)"
    note "d2h pinned copy: $(awk '/^copy device->host/ {print $3}' "$work/device.log") GB/s (256 MiB)"
    grep -E "^optimizer step:|^sum of squares" "$work/device.log" | while read -r line; do note "$line"; done
  fi
  if [[ $benches == *step* ]]; then
    mkdir -p "$work/nvme"
    for optimizer in host nvme; do
      cat >"$work/step-$optimizer.toml" <<EOF
[tiers.device]
kind = "$device"
budget = "16GiB"
[tiers.host]
budget = "16GiB"
  [tiers.nvme]
paths = ["$work/nvme"]
budget = "8GiB"
[zero]
stage = 3
params = "device"
grads = "device"
optimizer = "$optimizer"
EOF
      if timeout 120 "$strata" bench step "$work/step-$optimizer.toml" --device "$device" --params 1e8 \
        --unit-params 1e7 --steps 2 --overwrite --json >"$work/step-$optimizer.json"; then
        note "bench step, 1e8 params, optimizer on $optimizer: $(json_number t_step_s "$work/step-$optimizer.json") s/step (t_io $(json_number t_io_s "$work/step-$optimizer.json") s)"
      else
        fail "bench step, optimizer on $optimizer"
      fi
    done
    rm -rf "$work/nvme"
  fi
  # The decoder's attention alone: 8 x 1024 positions, 16 heads over 4 kv heads, head_dim 128,
  # causal (the 1.08 B Llama's), lines "attention-bench: <pass> <kernel> ms <ms> TFLOPS <t>".
  if [[ $benches != *attention* ]]; then
    :
  elif timeout 120 "$build/examples/llm/strata-attention-bench" --iterations 10 --warmup 2 \
      >"$work/attention.log" 2>&1; then
    cat "$work/attention.log"
    grep -E '^attention-bench: (forward|backward) ' "$work/attention.log" |
      while read -r _ pass kernel _ ms _ tflops; do
        note "attention $pass $kernel (8 x 1024, 16/4 heads, 128, causal): $ms ms, $tflops TFLOPS"
      done
  else
    fail "attention bench"; tail -n 20 "$work/attention.log"
  fi
  # The bf16 decoder's element-wise, norm and loss kernels one by one on the 1.08 B Llama's shape
  # (8192 rows, hidden 2048, inner 5632, 16/4 heads of 128; the loss on one chunk of a 32000 and
  # a 128256 vocabulary), lines "kernel-bench: <kernel> ms <ms> MB <MB> GB/s <GB/s> of-copy <f>"
  # (f: the fraction of the same run's device-to-device copy GB/s), then a step estimate per
  # vocabulary (each kernel's time x its calls in one step).
  if [[ $benches != *kernels* ]]; then
    :
  elif [[ $device != cuda ]]; then
    note "kernel bench: skipped (it needs a GPU)"
  elif timeout 120 "$build/examples/llm/strata-kernel-bench" --iterations 20 --warmup 3 \
      >"$work/kernels.log" 2>&1; then
    cat "$work/kernels.log"
    grep -E '^kernel-bench: [a-z_0-9]+ +ms ' "$work/kernels.log" |
      while read -r _ kernel _ ms _ mb _ gbps _ of_copy; do
        note "kernel $kernel (1.08 B Llama shape): $ms ms, $mb MB, $gbps GB/s, $of_copy of the d2d copy"
      done
  else
    fail "kernel bench"; tail -n 20 "$work/kernels.log"
  fi
fi

# --- llama: the 1.08 B folder, strata against PyTorch ---
llama="$work/llama-1b"
make_llama() {
  [[ -d $llama ]] || "$make_model" --out "$llama" --family llama --hidden-size "$llama_hidden" \
    --intermediate-size "$llama_inner" --layers "$llama_layers" --heads "$llama_heads" \
    --kv-heads "$llama_kv" --max-positions 4096 --seed 1
}
if wanted llama; then
  stamp llama
  make_llama
  # FLOP per token at seq 1024: 6 N + 12 L d T.
  params=$(python3 -c "
import json; c = json.load(open('$llama/config.json')); d, L, i, V = c['hidden_size'], c['num_hidden_layers'], c['intermediate_size'], c['vocab_size']
kv = d // c['num_attention_heads'] * c['num_key_value_heads']
print(L * (2 * d * d + 2 * d * kv + 3 * d * i + 2 * d) + 2 * V * d + d)")
  flop=$(awk -v n="$params" -v l="$llama_layers" -v d="$llama_hidden" 'BEGIN { print 6 * n + 12 * l * d * 1024 }')
  note "Llama folder: $params parameters, $(awk -v f="$flop" 'BEGIN { printf "%.2f", f / 1e9 }') GFLOP/token at seq 1024"
  declare -A tokens_of
  for placement in ${GPU_CHECK_PLACEMENTS:-all_device optimizer_host optimizer_split}; do
    name=${placement//\//-}  # h200/all_device -> h200-all_device
    big_config "$placement" "$work/$name-big.toml"
    log="$work/llama-$name.log"
    stamp "strata $placement"
    if timeout 180 "$finetune" --model "$llama" --config "$work/$name-big.toml" --device "$device" \
      --seq-len 1024 --micro-batch 8 --steps "$llama_steps" --overwrite --eval-every 0 \
      --eval-batches 1 --data "$data_dir" $([[ $device == cuda ]] && echo --profile) >"$log" 2>&1; then
      grep -E "device:|attention|^step|gpu:" "$log" | head -n 20
      tokens_of[$placement]=$(median_tokens "$log")
      note "strata Llama $placement on $device: ${tokens_of[$placement]} tokens/s, $(rate "${tokens_of[$placement]}" "$flop")"
      grep -q "  gpu: " "$log" && note "strata Llama $placement, last step on the GPU: $(grep "  gpu: " "$log" | tail -n 1 | sed 's/^ *gpu: //')"
    else
      fail "strata Llama $placement"; tail -n 20 "$log"; tokens_of[$placement]=0
    fi
  done
  # [Note: asynchronous unit calls]: the same all-device run with every unit call waited for, as
  # before, so one lease measures what the asynchronous calls gain (GPU_CHECK_SYNC_AB=0: skip).
  if [[ ${GPU_CHECK_SYNC_AB:-1} == 1 && $device == cuda && -f $work/all_device-big.toml ]]; then
    log="$work/llama-all_device-sync.log"
    stamp "strata all_device, synchronous unit calls"
    if timeout 180 "$finetune" --model "$llama" --config "$work/all_device-big.toml" --device "$device" \
      --seq-len 1024 --micro-batch 8 --steps "$llama_steps" --overwrite --eval-every 0 \
      --eval-batches 1 --data "$data_dir" --profile --synchronous-unit-calls >"$log" 2>&1; then
      tokens_of[all_device_sync]=$(median_tokens "$log")
      note "strata Llama all_device, synchronous unit calls: ${tokens_of[all_device_sync]} tokens/s, $(rate "${tokens_of[all_device_sync]}" "$flop")"
      grep -q "  gpu: " "$log" && note "strata Llama all_device synchronous, last step on the GPU: $(grep "  gpu: " "$log" | tail -n 1 | sed 's/^ *gpu: //')"
      note "ratio strata all_device asynchronous / synchronous unit calls: $(ratio "${tokens_of[all_device]:-0}" "${tokens_of[all_device_sync]:-0}")"
    else
      fail "strata Llama all_device, synchronous unit calls"; tail -n 20 "$log"
    fi
  fi
  for mode in ${GPU_CHECK_TORCH:-plain fsdp2_offload}; do
    if [[ $device != cuda ]] || ! have_torch; then note "PyTorch $mode: skipped (no GPU, or python3 lacks torch + transformers)"; tokens_of[$mode]=0; continue; fi
    stamp "PyTorch $mode"
    if PYTHONUNBUFFERED=1 timeout 240 python3 scripts/gpu_torch_train.py --model "$llama" \
      --data "$data_dir" --seq-len 1024 --micro-batch 8 --steps "$llama_steps" --mode "$mode" \
      --json "$work/torch-$mode.json" 2>&1 | tail -n 12; then
      tokens_of[$mode]=$(json_number tokens_per_s "$work/torch-$mode.json")
      note "PyTorch $mode: ${tokens_of[$mode]:-0} tokens/s, $(rate "${tokens_of[$mode]:-0}" "$flop")"
    else
      fail "PyTorch $mode"; tokens_of[$mode]=0
    fi
  done
  note "ratio strata all_device / PyTorch plain: $(ratio "${tokens_of[all_device]:-0}" "${tokens_of[plain]:-0}")"
  note "ratio strata optimizer_host / PyTorch plain: $(ratio "${tokens_of[optimizer_host]:-0}" "${tokens_of[plain]:-0}")"
  note "ratio strata optimizer_host / FSDP2 CPUOffloadPolicy: $(ratio "${tokens_of[optimizer_host]:-0}" "${tokens_of[fsdp2_offload]:-0}")"
  note "ratio strata optimizer_host / strata all_device: $(ratio "${tokens_of[optimizer_host]:-0}" "${tokens_of[all_device]:-0}")"
  note "ratio strata optimizer_split / strata all_device: $(ratio "${tokens_of[optimizer_split]:-0}" "${tokens_of[all_device]:-0}")"
fi

# --- losses: the 1.08 B folder's first steps on cuda (the host device's run is in docs) ---
if wanted losses; then
  stamp losses
  make_llama
  big_config all_device "$work/losses.toml"
  log="$work/losses.log"
  if timeout 120 "$finetune" --model "$llama" --config "$work/losses.toml" --device "$device" \
    --seq-len 256 --micro-batch 2 --steps 5 --overwrite --eval-every 0 --eval-batches 2 \
    --data "$data_dir" >"$log" 2>&1; then
    grep -E "^step" "$log"
    note "Llama losses on $device (seq 256 x 2): $(awk -F'|' '/^step +[0-9]+ \| loss/ { l = $2; sub(/ *loss /, "", l); printf "%s ", l }' "$log")"
  else
    fail "Llama losses on $device"; tail -n 20 "$log"
  fi
  # PyTorch on the same folder, hyper-parameters and batch shape (its own window order): whether a
  # loss spike in the first steps is this model at this learning rate, or strata's.
  if [[ $device == cuda ]] && have_torch; then
    PYTHONUNBUFFERED=1 timeout 180 python3 scripts/gpu_torch_train.py --model "$llama" \
      --data "$data_dir" --seq-len 256 --micro-batch 2 --steps 5 --mode plain \
      --json "$work/torch-losses.json" 2>&1 | tail -n 7
    note "PyTorch losses (seq 256 x 2): $(python3 -c "import json; print(' '.join(f'{x:.4f}' for x in json.load(open('$work/torch-losses.json'))['losses']))" 2>/dev/null)"
  fi
fi

# The 90 M Llama folder of the export and agreement sections (fine-tuning leaves it as it is).
small="$work/llama-90m"
make_small_llama() {
  [[ -d $small ]] || "$make_model" --out "$small" --family llama --hidden-size 1024 \
    --intermediate-size 2816 --layers 8 --heads 16 --kv-heads 4 --max-positions 4096 >/dev/null
}

# --- export: transformers loads strata's export ---
if wanted export; then
  stamp export
  make_small_llama
  sed "s|/var/tmp/strata-nvme|$work/nvme|" examples/configs/all_device.toml >"$work/export.toml"
  text="$data_dir/Apache-2.0"
  if ! timeout 120 "$finetune" --model "$small" --config "$work/export.toml" --device "$device" \
      --seq-len 512 --micro-batch 8 --steps 2 --overwrite --eval-every 0 --eval-batches 1 \
      --data "$data_dir" --export "$work/exported" >"$work/export.log" 2>&1; then
    fail "export: fine-tuning with --export"; tail -n 20 "$work/export.log"
  elif ! timeout 120 "$build/examples/llm/strata-eval" --model "$work/exported" --data "$text" \
      --seq-len 256 --json --dump "$work/dump" >"$work/eval.json" 2>"$work/eval.err"; then
    fail "export: strata-eval --dump"; cat "$work/eval.err"
  elif ! have_torch; then
    note "export: transformers check skipped (python3 lacks torch + transformers); strata-eval: $(cat "$work/eval.json")"
  elif PYTHONUNBUFFERED=1 timeout 180 python3 scripts/gpu_export_check.py --model "$work/exported" \
      --dump "$work/dump" --eval-json "$work/eval.json" --text "$text" --seq-len 256 \
      >"$work/export-check.log" 2>&1; then
    grep -E "^export-check:" "$work/export-check.log" | sed 's/^export-check: //' |
      while read -r line; do note "export: $line"; done
  else
    cat "$work/export-check.log"
    fail "export: transformers check"
  fi
fi

# --- agreement: CUDA's losses against the host device's on the 90 M folder ---
# Both runs: all_device.toml (seed 1234, the same windows in the same order), so the only
# difference is the device's arithmetic (bf16 activations and tensor-core products on cuda, fp32
# products on the host). The host run costs about 6 core-s per step at seq 256 x 4 (measured on a
# 2-core VM): 20 steps fit in well under 90 s on the GPU machine's 16 cores. With
# GPU_CHECK_DEVICE=host both runs are the host device and must agree exactly.
if wanted agreement; then
  stamp agreement
  make_small_llama
  sed "s|/var/tmp/strata-nvme|$work/nvme|" examples/configs/all_device.toml >"$work/agreement.toml"
  shape="90 M Llama, $agreement_steps steps of seq $agreement_seq x $agreement_batch"
  agreement_run() {  # device, log
    timeout 300 "$finetune" --model "$small" --config "$work/agreement.toml" --device "$1" \
      --seq-len "$agreement_seq" --micro-batch "$agreement_batch" --steps "$agreement_steps" \
      --overwrite --eval-every 0 --eval-batches 1 --data "$data_dir" >"$2" 2>&1
  }
  if ! agreement_run "$device" "$work/agreement-$device.log"; then
    fail "agreement: fine-tuning on $device"; tail -n 20 "$work/agreement-$device.log"
  elif ! agreement_run host "$work/agreement-reference.log"; then
    fail "agreement: fine-tuning on the host device"; tail -n 20 "$work/agreement-reference.log"
  else
    echo "step | loss on the host device | loss on $device"
    paste <(grep -E "^step +[0-9]+ \| loss" "$work/agreement-reference.log" | cut -d'|' -f1-2) \
      <(grep -E "^step +[0-9]+ \| loss" "$work/agreement-$device.log" | cut -d'|' -f2)
    python3 scripts/compare-step-losses.py "$work/agreement-reference.log" \
      "$work/agreement-$device.log" --tolerance 0.01 --steps "$agreement_steps" >"$work/agreement.txt"
    status=$?
    cat "$work/agreement.txt"
    verdict="($shape), $device against host: $(tail -n 1 "$work/agreement.txt" | sed 's/^compare-step-losses: //')"
    if ((status == 0)); then note "agreement $verdict"; else fail agreement "$verdict"; fi
  fi
  rm -rf "$work/nvme"
fi

# --- gpt: the built-in GPT, micro-batch 8 x 128 tokens, 8 steps per placement and device ---
if wanted gpt; then
  stamp gpt
  for placement in all_device optimizer_host params_optimizer_nvme; do
    sed "s|/var/tmp/strata-nvme|$work/nvme|" "examples/configs/$placement.toml" >"$work/$placement.toml"
    for on in $(printf '%s\n' "$device" host | sort -u); do
      log="$work/gpt-$placement-$on.log"
      if timeout 120 "$finetune" --config "$work/$placement.toml" --device "$on" --steps 8 \
        --overwrite --eval-every 0 --eval-batches 1 --data "$data_dir" \
        --summary-json "$work/gpt.json" >"$log" 2>&1; then
        params=$(json_number params "$work/gpt.json")
        tokens=$(median_tokens "$log")
        # 6 N + 12 L d T FLOP per token (PaLM's count): 8 layers, d 512, T 128.
        flop=$(awk -v n="$params" 'BEGIN { print 6 * n + 12 * 8 * 512 * 128 }')
        note "GPT $placement on $on: $tokens tokens/s, $(rate "$tokens" "$flop")"
      else
        fail "GPT $placement on $on"; tail -n 20 "$log"
      fi
    done
  done
  rm -rf "$work/nvme"
fi

# --- sanitizer ---
if wanted sanitizer; then
  stamp sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  sanitize() {  # tool, suite, filter
    local options=(--tool "$1" --error-exitcode 1 --print-limit 20)
    [[ $1 == memcheck ]] && options+=(--leak-check full)
    timeout 240 "$sanitizer" "${options[@]}" "$build/$2" --gtest_filter="$3" --gtest_brief=1 \
      >"$work/sanitize.log" 2>&1
    local status=$?
    grep -E "ERROR SUMMARY|========= (Invalid|Race|Leak)" "$work/sanitize.log" | head -n 8
    if ((status == 0)); then note "$1 $(basename "$2") ($3): clean"
    else fail "$1 $(basename "$2") ($3): exit $status"; tail -n 30 "$work/sanitize.log"; fi
  }
  # The optimizer's large sizes (millions of elements x 324 cases) would take most of the time
  # under memcheck; its small sizes run every kernel, aligned and not, with guards around arrays.
  sanitize memcheck tests/tiers/strata_tiers_tests "$cuda_filter-*LargeSizes*"
  sanitize memcheck tests/models/llm/strata_llm_model_tests '*DecoderCuda*:*FlashAttentionCuda*:*FusedKernelsCuda*'
  sanitize memcheck tests/models/strata_gpt_tests "$cuda_filter"
  sanitize racecheck tests/tiers/strata_tiers_tests \
    'Backends/DeviceCastTest.*/cuda:Backends/DeviceTest.*Accumulate*/cuda:CudaOptimizer/OptimizerMatrix.*int8*grad_bf16_out_bf16:Backends/DeviceSumOfSquaresTest.*/cuda'
  sanitize racecheck tests/models/llm/strata_llm_model_tests '*DecoderCuda*.Fp32*:*FlashAttentionCuda*'
fi

stamp done
echo
echo "== summary (also in $summary_file)"
cat "$summary_file"
if ((${#failed[@]} > 0)); then
  echo "gpu-check: ${#failed[@]} section(s) failed: ${failed[*]}"
  exit 1
fi
