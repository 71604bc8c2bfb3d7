#!/usr/bin/env bash
# Session 59: the attention GPU tests that this session's test changes touch — the
# cooperative tiles' test, which had skipped itself on the H200 since native kernels became
# the default (it asked the default kernel whether cooperative matrices exist), the generic
# test (native now named as such), and the native backward and head-dims tests (one
# helper for a forced native stage).
source bench/s54_device.sh
for f in every_coop every_head_dim native_backward native_head_dims; do
  gputest $f $f
  grep -E "^(attn|attention|skipped)" $x/test-$f.txt | cut -c1-160 | head -12
done
save
