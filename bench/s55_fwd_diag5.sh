# Session 55, call 7: the forward's skeleton without its softmax (HELIOS_FWD_X=19) taken
# apart: +4096 no P·V wgmma, +8192 no S wgmma, both; two rounds.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for X in 19 4115 8211 12307; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
done
for f in $x/*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | head -2 | awk '{print $4}' | tr '\n' ' ')"; done
save
