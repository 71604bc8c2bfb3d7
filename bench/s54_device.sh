# Sourced by the device scripts of sessions 54-58 (bench/s5[4-8]_*.sh): session 53's preamble (loader,
# environment, /tmp/x and `save`), then `attn`, one profiled round of the attention bench,
# `record`, the figures of record, `losses`, a short GPT-2 run's losses, and `gputest`, the
# attention GPU tests.
source bench/s53_device.sh
# attn NAME BINARY SHAPES DTYPES [VAR=VALUE...]: .gpu/BINARY's bench of SHAPES and DTYPES
# with the variables set, into $x/NAME-$r.txt (its own kernel cache); prints the medians,
# the profiled stages' GPU µs and any warning.
attn() {
  local n=$1 b=$2 shapes=$3 dtypes=$4; shift 4
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/$b bench attention \
    --shapes "$shapes" --dtypes "$dtypes" > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ *(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s %s | ", $1, $2, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | head -8 | cut -c1-90; grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
# record: the figures of record with .gpu/helios — attention beside PyTorch (tuned, bf16
# and f16, at GPT-2's shapes and head dim 128) into $x/attention.{txt,json}, then the GPT-2
# bf16 step beside eager and torch.compile into $x/train.txt.
record() {
  HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-rec timeout 200 .gpu/helios bench attention \
    --shapes 8x12x1024x64,8x12x512x64,4x16x2048x128 --dtypes bf16,f16 --compare torch \
    --json $x/attention.json > $x/attention.txt 2> $x/attention.err
  echo "== attention rc=$?"; cut -c1-200 $x/attention.txt; save
  HELIOS_CACHE_DIR=/tmp/c-rec timeout 150 .gpu/helios bench train --cases gpt2 --dtypes bf16 \
    --compare torch > $x/train.txt 2> $x/train.err
  echo "== train rc=$?"; cut -c1-220 $x/train.txt; save
}
# losses BINARY...: 12 GPT-2 bf16 training steps with each .gpu/BINARY into
# $x/loss-BINARY.txt, printing the losses to set side by side.
losses() {
  local b
  for b in "$@"; do
    HELIOS_CACHE_DIR=/tmp/c-loss-$b timeout 100 .gpu/$b train --preset gpt2 --steps 12 --batch 8 \
      --seq 1024 --precision bf16 --eval-every 1000 --sample-tokens 0 --out /tmp/run-$b > $x/loss-$b.txt 2>&1
    echo "== $b rc=$?"; grep -iE "step|loss" $x/loss-$b.txt | tail -14
    rm -rf /tmp/run-$b
  done
  save
}
# gputest NAME FILTER [VAR=VALUE...]: .gpu/t_attention's tests matching FILTER with the
# variables set, into $x/test-NAME.txt (its own kernel cache); prints the result and any
# panic.
gputest() {
  local n=$1 f=$2; shift 2
  env "$@" HELIOS_CACHE_DIR=/tmp/c-test-$n timeout 300 .gpu/t_attention --test-threads 1 "$f" \
    --nocapture > $x/test-$n.txt 2>&1
  echo "== test $n rc=$?"; grep -E "test result|panicked" $x/test-$n.txt | head -5
}
# fwd_rounds BINARY...: two profiled rounds of the forward at T = 1024 and 2048 with each
# .gpu/BINARY, the 192 × 64 tile (bf16, f16) and the 128 × 64 one (bf16), the first binary
# first (the script stops when its first bench hangs); then each file's GPU µs.
fwd_rounds() {
  local s=8x12x1024x64,8x12x2048x64 b
  for r in 1 2; do
    for b in "$@"; do
      attn $b-192 $b $s bf16,f16 HELIOS_ATTN_VARIANT=fwd=nv192x64
      [ $r$b = 1$1 ] && ! grep -q "fwd bf16" $x/$b-192-$r.txt && { save; exit 1; }
      attn $b-128 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv128x64
    done
  done
  for f in $x/helios*-[12].txt; do echo "$f fwd: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
  save
}
