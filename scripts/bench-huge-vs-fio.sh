#!/usr/bin/env bash
# #18's disk-bound target: a model whose state lives on NVMe steps no slower than 1.1x the time
# its bytes take at fio's speed. Measures, in one run and on the store's own file system:
#   1. fio sequential read and write with registered buffers (`--ioengine=io_uring --direct=1
#      --fixedbufs=1`) at the config's [tiers.nvme] block_size and queue_depth;
#   2. `strata-finetune --config CONFIG --steps STEPS` (its per-step "nvme r .. w .." bytes and
#      step time);
#   3. fio again (the disk drifts; the bound uses the mean of the before and after runs);
# then prints, per step after the first, t_step / (read bytes / fio read rate + written bytes /
# fio write rate), and the same against fio's fastest run (the strictest bound), as Markdown.
#
#   scripts/bench-huge-vs-fio.sh                         # huge.toml as shipped, 3 steps
#   CONFIG=my.toml STEPS=4 scripts/bench-huge-vs-fio.sh
#   EXTRA='state_dtype = "int8"
#   master_dtype = "bf16"' scripts/bench-huge-vs-fio.sh  # keys added under [optimizer]
# Environment: CONFIG, STEPS (default 3), FINETUNE (strata-finetune binary), SIZE (fio file
#   size, default 4GiB), EXTRA (TOML lines added under [optimizer]), ZERO_EXTRA (under [zero]),
#   KEEP_LOG=F copies the training log to F, TARGET (default 1.1; STRICT=1 exits 1 above it).
set -euo pipefail
cd "$(dirname "$0")/.."

config=${CONFIG:-examples/configs/huge.toml}
steps=${STEPS:-3}
finetune=${FINETUNE:-build/ci/examples/finetune/strata-finetune}
size=${SIZE:-4GiB}
target=${TARGET:-1.1}

command -v fio >/dev/null || { echo "bench-huge-vs-fio: fio not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
[ -x "$finetune" ] || { echo "bench-huge-vs-fio: $finetune not built (cmake --build --preset ci --target strata-finetune)" >&2; exit 2; }
[ -f "$config" ] || { echo "bench-huge-vs-fio: config $config not found" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"; [ -n "${fio_file:-}" ] && rm -f "$fio_file"' EXIT

# The config the run uses: CONFIG with EXTRA under [optimizer] and ZERO_EXTRA under [zero].
python3 - "$config" "$out/config.toml" "${EXTRA:-}" "${ZERO_EXTRA:-}" <<'PY'
import re, sys
source, dest, extra, zero_extra = sys.argv[1:5]
text = open(source).read()
for section, lines in (("optimizer", extra), ("zero", zero_extra)):
    if not lines.strip():
        continue
    header = f"[{section}]\n"
    if header not in text:
        text += f"\n{header}"
    text = text.replace(header, header + lines.strip() + "\n", 1)
open(dest, "w").write(text)
PY

# The store's directory, block size and queue depth, as the config gives them.
read -r store_dir block_bytes queue_depth < <(python3 - "$out/config.toml" <<'PY'
import re, sys, tomllib
nvme = tomllib.load(open(sys.argv[1], "rb")).get("tiers", {}).get("nvme", {})
paths = nvme.get("paths") or [nvme.get("path", "")]
def to_bytes(value):
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", str(value))
    if not m:
        sys.exit(f"bench-huge-vs-fio: cannot read block_size '{value}'")
    return int(m.group(1)) * {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
print(paths[0], to_bytes(nvme.get("block_size", "1MiB")), nvme.get("queue_depth", 16))
PY
)
[ -n "$store_dir" ] || { echo "bench-huge-vs-fio: $config has no [tiers.nvme] paths" >&2; exit 2; }
mkdir -p "$store_dir"
fio_file="$(dirname "$store_dir")/bench-huge-vs-fio.dat"

fio_mb_per_s() {  # rw
  # Terse v3: field 7 is read bandwidth, field 48 write bandwidth, both KiB/s.
  local field=7
  [ "$1" = write ] && field=48
  fio --name=bench --filename="$fio_file" --size="$size" --bs="$block_bytes" \
      --iodepth="$queue_depth" --rw="$1" --ioengine=io_uring --direct=1 --fixedbufs=1 \
      --numjobs=1 --output-format=terse --terse-version=3 |
    awk -F';' -v f="$field" '{printf "%.1f\n", $f * 1024 / 1e6}'
}

echo "bench-huge-vs-fio: $config, $steps steps; fio on $(dirname "$fio_file") ($(stat -f -c %T "$store_dir")), $size, block $block_bytes B, queue depth $queue_depth"
fio_mb_per_s write >/dev/null  # lays the file out; not counted
w1=$(fio_mb_per_s write); r1=$(fio_mb_per_s read)
echo "fio before: read $r1 MB/s, write $w1 MB/s"
"$finetune" --config "$out/config.toml" --steps "$steps" --eval-every 0 --eval-batches 1 \
  --overwrite >"$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }
[ -n "${KEEP_LOG:-}" ] && cp "$out/train.log" "$KEEP_LOG"
r2=$(fio_mb_per_s read); w2=$(fio_mb_per_s write)
echo "fio after:  read $r2 MB/s, write $w2 MB/s"
grep -E '^step +[0-9]+ \| loss' "$out/train.log" || true
grep -E '^summary' "$out/train.log" || true

status=0
python3 - "$out/train.log" "$r1" "$r2" "$w1" "$w2" "$target" <<'PY' || status=$?
import re, sys
log, r1, r2, w1, w2, target = sys.argv[1], *map(float, sys.argv[2:7])
units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
def to_bytes(text):
    value, unit = text.split()
    return float(value) * units[unit]
rows = []
for line in open(log):
    m = re.match(r"step\s+(\d+) \|.*?\| ([\d.]+) s: .*\| nvme r ([\d.]+ \w+) w ([\d.]+ \w+)", line)
    if m:
        rows.append((int(m.group(1)), float(m.group(2)), to_bytes(m.group(3)), to_bytes(m.group(4))))
if len(rows) < 2:
    sys.exit("bench-huge-vs-fio: fewer than two step lines in the training log")
read_rate, write_rate = (r1 + r2) / 2 * 1e6, (w1 + w2) / 2 * 1e6
best_read, best_write = max(r1, r2) * 1e6, max(w1, w2) * 1e6
print(f"\nfio mean: read {read_rate / 1e6:.0f} MB/s, write {write_rate / 1e6:.0f} MB/s "
      f"(best: {best_read / 1e6:.0f} / {best_write / 1e6:.0f})")
print("| step | t_step | NVMe read + written | bound at fio's mean | t_step / bound | t_step / bound at fio's best |")
print("|---:|---:|---:|---:|---:|---:|")
worst = 0.0
for step, t, r, w in rows[1:]:  # the first step reads more (its warm-up); the steady ones count
    bound = r / read_rate + w / write_rate
    strict = r / best_read + w / best_write
    worst = max(worst, t / bound)
    print(f"| {step} | {t:.2f} s | {r / 1e9:.1f} + {w / 1e9:.1f} GB | {bound:.2f} s | "
          f"{t / bound:.3f} | {t / strict:.3f} |")
print(f"worst t_step / bound: {worst:.3f} (target <= {target})")
sys.exit(3 if worst > target else 0)
PY
if [ "$status" = 3 ]; then
  echo "bench-huge-vs-fio: above the $target target"
  [ "${STRICT:-0}" = 1 ] && exit 1
fi
exit 0
