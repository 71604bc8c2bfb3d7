#!/usr/bin/env bash
# Session 56's record (call 3), binaries built from 0db5389 (.gpu/helios, .gpu/t_attention)
# and 6aeb8ab (.gpu/helios-main): the native GPU tests; the default forward before and
# after (untuned, profiled); attention beside PyTorch (tuned, bf16 and f16); the GPT-2
# bf16 step beside eager and torch.compile.
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 230 .gpu/t_attention --test-threads 1 native > $x/test-rec.txt 2>&1
echo "== test native rc=$?"; grep -E "^test |test result|panicked" $x/test-rec.txt | head -12
save
r=1
for b in helios-main helios; do attn $b $b 8x12x1024x64,8x12x2048x64,4x16x2048x128 bf16; done
save
record
