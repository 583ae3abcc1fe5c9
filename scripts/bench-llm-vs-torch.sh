#!/usr/bin/env bash
# Training throughput (forward + backward tokens/s) of a ~100 M-parameter Llama-architecture
# decoder on the host: strata (strata-llm-bench, fp32 OpenBLAS) and PyTorch (python3-torch on the
# CPU, scripts/bench-llm-vs-torch.py) on the same model, batch, sequence length and thread count,
# in one run; prints both and the ratio strata / torch.
#   THREADS=2 BATCH=4 SEQ_LEN=256 STEPS=3 scripts/bench-llm-vs-torch.sh   # builds nocuda first
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
batch=${BATCH:-4}
seq_len=${SEQ_LEN:-256}
steps=${STEPS:-3}
preset=${PRESET:-nocuda}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$threads" --target strata-llm-bench >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Llama 3 layout at ~96 M parameters: GQA 10 heads over 5 kv heads, SwiGLU, untied head.
cat >"$out/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 640, "intermediate_size": 1728,
 "num_hidden_layers": 12, "num_attention_heads": 10, "num_key_value_heads": 5,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 32000,
 "max_position_embeddings": 4096, "tie_word_embeddings": false, "hidden_act": "silu",
 "torch_dtype": "float32"}
JSON
echo "== strata (build/$preset/examples/llm/strata-llm-bench)"
"./build/$preset/examples/llm/strata-llm-bench" --config "$out/config.json" --threads "$threads" \
  --batch "$batch" --seq-len "$seq_len" --steps "$steps" | tee "$out/strata.log"
echo "== PyTorch (/usr/bin/python3)"
OMP_NUM_THREADS=$threads /usr/bin/python3 scripts/bench-llm-vs-torch.py "$out/config.json" \
  "$threads" "$batch" "$seq_len" "$steps" | tee "$out/torch.log"
strata=$(awk '/^tokens_per_s:/ {print $2}' "$out/strata.log")
torch=$(awk '/^tokens_per_s:/ {print $2}' "$out/torch.log")
awk -v s="$strata" -v t="$torch" -v th="$threads" -v b="$batch" -v q="$seq_len" \
  'BEGIN { printf "tokens/s (batch %d x seq %d, %d threads): strata %.0f, torch %.0f, ratio %.2f\n", b, q, th, s, t, s / t }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
