# Session 55, call 4: the forward's cost per block and per item (T = 512, 1024, 2048 with
# and without the softmax: HELIOS_FWD_X 3 and 19), and a third stage in K's ring (+512) or
# V's (+1024), two rounds.
source bench/s54_device.sh
s=8x12x512x64,8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for X in 3 19 515 1027 531; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
done
save
