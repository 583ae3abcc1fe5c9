#!/usr/bin/env bash
# Runs `strata bench io` (registered buffers) and fio in its best configuration here (io_uring,
# O_DIRECT, registered buffers: `--ioengine=io_uring --direct=1 --fixedbufs=1`; without fixedbufs
# fio reads at about half the speed on a virtio disk) with the same parameters on the same file
# system, in turn, RUNS times each, for sequential write and read at (1 MiB, qd 16) and
# (4 MiB, qd 8), and prints the median MB/s of each, the median of the paired strata/fio ratios
# (target: >= 0.95 everywhere; the headline) and the ratio of the medians, as a Markdown table.
#
# Quick by default (1 GiB, 7 runs: about a minute):   scripts/bench-io-vs-fio.sh
# Full (4 GiB, 9 runs: a few minutes):                SIZE=4GiB RUNS=9 scripts/bench-io-vs-fio.sh
# Environment: SIZE (KiB/MiB/GiB), RUNS, DIR (scratch directory on the file system to measure),
#   STRATA (the strata binary), KEEP=1 keeps the files, STRICT=1 exits 1 below target.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1GiB}
RUNS=${RUNS:-7}
DIR=${DIR:-build/bench-io}
STRATA=${STRATA:-build/ci/runtime/strata}
TARGET=0.95

command -v fio >/dev/null || { echo "bench-io-vs-fio: fio not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
[ -x "$STRATA" ] || { echo "bench-io-vs-fio: $STRATA not built (cmake --build --preset ci)" >&2; exit 2; }

# fio and strata both take binary suffixes; fio gets plain bytes so there is no doubt.
to_bytes() {
  local n=${1%%[!0-9]*} unit=${1##*[0-9]}
  case "$unit" in
    ""|B) echo "$n" ;;
    k|K|KiB) echo $((n * 1024)) ;;
    m|M|MiB) echo $((n * 1024 * 1024)) ;;
    g|G|GiB) echo $((n * 1024 * 1024 * 1024)) ;;
    *) echo "bench-io-vs-fio: cannot read size '$1' (use KiB, MiB or GiB)" >&2; exit 2 ;;
  esac
}
size_bytes=$(to_bytes "$SIZE")
mkdir -p "$DIR"
# Both tools use the same file (strata creates and preallocates it on its first run, each run
# rewrites or reads all of it), so file layout cannot favour either.
shared_file="$DIR/strata-bench-io.dat"
cleanup() { if [ "${KEEP:-0}" != 1 ]; then rm -f "$DIR"/strata-bench-io*; fi; }
trap cleanup EXIT

strata_mb_per_s() {  # rw bs qd
  "$STRATA" bench io --dir "$DIR" --size "$size_bytes" --block-size "$2" --queue-depth "$3" \
      --rw "$1" --engine io_uring --direct true --fixed-buffers true --json |
    sed -n 's/.*"mb_per_s":\([0-9.eE+-]*\).*/\1/p'
}

fio_mb_per_s() {  # rw bs qd
  # Terse v3: field 7 is read bandwidth, field 48 write bandwidth, both KiB/s.
  local field=7
  [ "$1" = write ] && field=48
  fio --name=bench --filename="$shared_file" --size="$size_bytes" --bs="$2" --iodepth="$3" \
      --rw="$1" --ioengine=io_uring --direct=1 --fixedbufs=1 --numjobs=1 \
      --output-format=terse --terse-version=3 |
    awk -F';' -v f="$field" '{printf "%.1f\n", $f * 1024 / 1e6}'
}

median() { sort -g | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

echo "bench-io-vs-fio: $SIZE per run, $RUNS runs each, directory $DIR ($(stat -f -c %T "$DIR"))"
echo "| workload | strata MB/s | fio MB/s | strata/fio (median of paired runs) | ratio of medians |"
echo "|---|---:|---:|---:|---:|"
below=0
for config in "1048576 16" "4194304 8"; do
  read -r bs qd <<<"$config"
  for rw in write read; do
    strata_runs=() fio_runs=() ratios=()
    for ((i = 0; i < RUNS; i++)); do
      # Alternate who goes first: the second reader of a file may find it in a cache below the
      # file system (the hypervisor's, on a VM) that the first one warmed.
      if ((i % 2 == 0)); then
        s=$(strata_mb_per_s "$rw" "$bs" "$qd")
        f=$(fio_mb_per_s "$rw" "$bs" "$qd")
      else
        f=$(fio_mb_per_s "$rw" "$bs" "$qd")
        s=$(strata_mb_per_s "$rw" "$bs" "$qd")
      fi
      strata_runs+=("$s") fio_runs+=("$f")
      ratios+=("$(awk -v s="$s" -v f="$f" 'BEGIN {printf "%.3f", s / f}')")
    done
    s_med=$(printf '%s\n' "${strata_runs[@]}" | median)
    f_med=$(printf '%s\n' "${fio_runs[@]}" | median)
    r_med=$(printf '%s\n' "${ratios[@]}" | median)
    printf '| seq %s %d MiB qd %d | %.0f | %.0f | %.2f | %.2f |\n' "$rw" $((bs / 1048576)) "$qd" \
      "$s_med" "$f_med" "$r_med" "$(awk -v s="$s_med" -v f="$f_med" 'BEGIN {print s / f}')"
    if awk -v r="$r_med" -v t="$TARGET" 'BEGIN {exit !(r < t)}'; then below=$((below + 1)); fi
  done
done
if [ "$below" -gt 0 ]; then
  echo "bench-io-vs-fio: $below workload(s) below the $TARGET target"
  [ "${STRICT:-0}" = 1 ] && exit 1
fi
exit 0
