# Session 55, call 3: call 2's diagnostics with the first-use check passed for them
# (HELIOS_FWD_X +16 no softmax, +32 no exponentials, +256 no rescale of O), two rounds.
source bench/s54_device.sh
s=8x12x1024x64
for r in 1 2; do
  for X in 3 19 35 259 291; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
done
save
