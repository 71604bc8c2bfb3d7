#!/usr/bin/env bash
# Reductions, softmax and norms on the GPU machine, one call: the ops benchmark beside PyTorch,
# then a sweep of the row-kernel switches (f32, no torch) to tune the defaults. The release test
# binaries, if carried as .gpu/t_{reduce,softmax,norm}, run first (correctness on the device).
# Usage (repo root, on the device machine): bench/gpu_ops.sh OUTDIR [bench args...]
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
for t in reduce softmax norm; do
  if [ -x .gpu/t_$t ]; then
    timeout 120 .gpu/t_$t > "$out/tests-$t.txt" 2>&1; echo "tests $t rc=$?"
    grep -E "^test result|panicked" "$out/tests-$t.txt" | head -5
  fi
done
timeout 300 $B bench ops --compare torch --json "$out/ops.json" "$@" > "$out/ops.txt" 2> "$out/ops.err"
echo "bench rc=$?"; grep -E "error|note" "$out/ops.err" | head; cat "$out/ops.txt"
# Sweep: one switch at a time against the defaults, f32 only; median µs and % copy per case.
sweep() {
  local tag=$1; shift
  env "$@" timeout 120 $B bench ops --dtypes f32 --samples 10 --json "$out/sweep-$tag.json" \
    > "$out/sweep-$tag.txt" 2>&1
  echo "== $tag: $*"
  grep -E "^(softmax|layernorm|sum)" "$out/sweep-$tag.txt" | awk '{print $1, $3, $4, $8}' | tr '\n' ';'; echo
}
sweep default
sweep wg512 HELIOS_WG=512
sweep wg1024 HELIOS_WG=1024
sweep slots4 HELIOS_ROW_SLOTS=4
sweep slots16 HELIOS_ROW_SLOTS=16
sweep unroll2 HELIOS_ROW_UNROLL=2
sweep unroll8 HELIOS_ROW_UNROLL=8
sweep split1056 HELIOS_SPLIT_GROUPS=1056
sweep split8448 HELIOS_SPLIT_GROUPS=8448
sweep normrows2 HELIOS_NORM_ROWS=2
sweep normrows8 HELIOS_NORM_ROWS=8
sweep streaming HELIOS_ROWS=streaming
sweep tree HELIOS_NO_SUBGROUP=1
