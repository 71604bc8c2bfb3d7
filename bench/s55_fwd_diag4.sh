# Session 55, call 5: 128-key blocks (one stage per ring, allowed by +2048) against 64-key ones, with and
# without the softmax (HELIOS_FWD_X 3, 19), two rounds.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for X in 3 19; do
    attn x$X helios $s bf16 HELIOS_FWD_X=$X
    attn b128x$X helios $s bf16 HELIOS_FWD_X=$((X+2048)) HELIOS_ATTN_VARIANT=fwd=nv128x128
  done
done
for f in $x/*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | head -2 | awk '{print $4}' | tr '\n' ' ')"; done
save
