# Session 55, call 2: where the forward's time goes (HELIOS_FWD_X: 3 the new order with tree
# maxima; +16 no softmax, P = S / 100; +32 no exponentials, P = x / 2; +64 a quarter and
# +128 half of the exponentials on the FMA pipe), and the 192-row tile, two rounds.
source bench/s54_device.sh
s=8x12x1024x64
for r in 1 2; do
  for X in 0 3 19 35 67 131; do attn x$X helios $s bf16 HELIOS_FWD_X=$X; done
  attn t192 helios $s bf16 HELIOS_FWD_X=3 HELIOS_ATTN_VARIANT=fwd=nv192x64
  attn t192p helios $s bf16 HELIOS_FWD_X=67 HELIOS_ATTN_VARIANT=fwd=nv192x64
done
save
