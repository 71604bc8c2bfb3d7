#!/usr/bin/env bash
# Session 53's measurement of FlashAttention-3's order in the native forward and Dq, the
# forward's Q prefetch, compute barriers around native launches and the multiply-high
# division (bench/results/2026-12-01-session53-h200.md). The HELIOS_EXP_* knobs existed only
# in the measured build (d1b25fa and the barrier knob on top); the `record` phase runs on
# any build. Expects .gpu/helios, .gpu/helios-old (main before the shifts, 7e4e937) and
# .gpu/t_attention, .gpu/t_native_matmul (tests/attention.rs, tests/native_matmul.rs).
# Usage: bench/s53_pipelined_check.sh PHASE...
#   (test, attn1, attn2, attnbar, losses, testbar, train, matmul, record)
source bench/s53_device.sh
SHAPES=8x12x1024x64,8x12x512x64,4x16x2048x128
declare -A KNOBS=(
  [none]=""
  [pipe]="HELIOS_EXP_PIPE=1"
  [pipe_qpre]="HELIOS_EXP_PIPE=1 HELIOS_EXP_QPRE=1"
  [pipe_dq]="HELIOS_EXP_PIPE_DQ=1"
  [all]="HELIOS_EXP_PIPE=1 HELIOS_EXP_PIPE_DQ=1 HELIOS_EXP_QPRE=1"
  [pipe_qpre_bar]="HELIOS_EXP_PIPE=1 HELIOS_EXP_QPRE=1 HELIOS_EXP_NATIVE_AS_COMPUTE=1"
  [bar]="HELIOS_EXP_NATIVE_AS_COMPUTE=1"
  [all_bar]="HELIOS_EXP_PIPE=1 HELIOS_EXP_PIPE_DQ=1 HELIOS_EXP_QPRE=1 HELIOS_EXP_NATIVE_AS_COMPUTE=1"
)
attn() { # round config [extra args]
  local r=$1 c=$2; shift 2
  local bin=.gpu/helios env_=""
  if [ "$c" = old ]; then bin=.gpu/helios-old; else env_=${KNOBS[$c]}; fi
  local f=$x/attn-$c-$r
  env $env_ HELIOS_CACHE_DIR=/tmp/c-$c HELIOS_PROFILE=1 timeout 90 $bin bench attention \
    --shapes $SHAPES --dtypes bf16 --json $f.json "$@" > $f.txt 2> $f.err
  echo "== attn $c round $r rc=$?"
  grep -E "µs|us " $f.txt | grep -v "^ *$" | cut -c1-160 | head -12
  save
}
for phase in "$@"; do
  case $phase in
  testbar)
    env ${KNOBS[bar]} HELIOS_CACHE_DIR=/tmp/c-testbar timeout 200 .gpu/t_attention --test-threads 1 native \
      > $x/test-bar.txt 2>&1
    echo "== test bar rc=$?"; grep -E "test result|panicked|error" $x/test-bar.txt | head; save
    env ${KNOBS[bar]} HELIOS_CACHE_DIR=/tmp/c-testbar timeout 150 .gpu/t_native_matmul --test-threads 1 \
      > $x/test-bar-mm.txt 2>&1
    echo "== native matmul test bar rc=$?"; grep -E "test result|panicked|error" $x/test-bar-mm.txt | head; save ;;
  record)
    HELIOS_CACHE_DIR=/tmp/c-rec timeout 200 .gpu/t_attention --test-threads 1 native > $x/test-rec.txt 2>&1
    echo "== test (defaults) rc=$?"; grep -E "test result|panicked|error" $x/test-rec.txt | head; save
    HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-rec timeout 240 .gpu/helios bench attention --shapes $SHAPES \
      --dtypes bf16,f16 --compare torch --json $x/attention.json > $x/attention.txt 2> $x/attention.err
    echo "== attention rc=$?"; cat $x/attention.txt | cut -c1-200; save
    HELIOS_CACHE_DIR=/tmp/c-rec timeout 240 .gpu/helios bench train --cases gpt2 --dtypes bf16 \
      --compare torch > $x/train.txt 2> $x/train.err
    echo "== train rc=$?"; cat $x/train.txt | cut -c1-220; save ;;
  test)
    env ${KNOBS[all]} HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native \
      > $x/test-all.txt 2>&1
    echo "== test all knobs rc=$?"; grep -E "test result|panicked|error" $x/test-all.txt | head; save ;;
  attn1) for c in old none pipe pipe_qpre pipe_dq all; do attn 1 $c; done ;;
  attn2) for c in all pipe_dq pipe_qpre none old; do attn 2 $c; done ;;
  attnbar) for r in 1 2; do attn $r all_bar; attn $r bar; done
         attn 3 all --compare torch ;;
  losses)
    # Native launches ordered by compute barriers: the same losses, bit for bit, as with
    # ALL_COMMANDS barriers (a missed dependency would change them).
    for c in none bar; do
      env ${KNOBS[$c]} HELIOS_CACHE_DIR=/tmp/cl-$c timeout 120 .gpu/helios train --preset gpt2 \
        --steps 12 --batch 8 --seq 1024 --precision bf16 --eval-every 1000 --sample-tokens 0 --out /tmp/run-$c \
        > $x/loss-$c.txt 2>&1
      echo "== losses $c rc=$?"; grep -iE "step|loss" $x/loss-$c.txt | tail -14 | cut -c1-150
      rm -rf /tmp/run-$c; save
    done
    diff <(grep -oE "loss [0-9.]+" $x/loss-none.txt) <(grep -oE "loss [0-9.]+" $x/loss-bar.txt) \
      && echo "losses identical" ;;
  matmul)
    for r in 1 2; do for b in helios-old helios; do
      HELIOS_CACHE_DIR=/tmp/cm-$b timeout 90 .gpu/$b bench matmul --dtypes bf16 --cases gpt2 \
        --variants nv256x192k16s3w2 > $x/mm-$b-$r.txt 2>&1
      echo "== matmul $b round $r rc=$?"; grep -vE "^\s*$" $x/mm-$b-$r.txt | tail -12 | cut -c1-160; save
    done; done ;;
  train)
    for c in ${TRAIN_CONFIGS:-none all}; do
      env ${KNOBS[$c]} HELIOS_CACHE_DIR=/tmp/ct-$c timeout 150 .gpu/helios bench train --cases gpt2 \
        --dtypes bf16 ${TRAIN_ARGS:-} > $x/train-$c.txt 2>&1
      echo "== train $c rc=$?"; grep -vE "^\s*$" $x/train-$c.txt | tail -8 | cut -c1-180; save
    done ;;
  esac
done
