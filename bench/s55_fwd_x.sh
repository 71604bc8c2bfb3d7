# Session 55, call 1: the forward's experiments (HELIOS_FWD_X bits: 1 FlashAttention-3's
# order, 2 tree row maxima, 4 tree row sums, 8 row sums on the tensor cores), screened at
# 8x12x1024x64 bf16, two rounds; then the GPU forward test with every bit on.
source bench/s54_device.sh
s=8x12x1024x64
for r in 1 2; do
  for X in 0 1 2 3 6 7 8 9 11 15; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
done
HELIOS_FWD_X=15 HELIOS_CACHE_DIR=/tmp/c-t15 timeout 150 .gpu/t_attention --test-threads 1 native_forward > $x/test15.txt 2>&1
echo "test15 rc=$?"; grep -E "test result|panicked|max err|error" $x/test15.txt | head
save
