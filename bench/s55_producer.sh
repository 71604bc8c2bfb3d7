# Session 55, call 8: the producer split over two warps, one a ring (HELIOS_FWD_X +16384),
# and a third V stage in the forward (+1024); two rounds.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for X in 0 16384 17408 1024; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
done
for f in $x/*.txt; do echo "$f: $(grep -o 'GPU µs [a-z]* [0-9.]*' $f | head -7 | awk '{print $3, $4}' | tr '\n' ' ')"; done
save
