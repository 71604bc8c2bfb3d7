#!/usr/bin/env bash
# Session 56's second record (call 6), .gpu/helios built from 9f76fd7 (lazy rescaling):
# attention beside PyTorch (tuned, bf16 and f16) and the GPT-2 bf16 step beside eager and
# torch.compile.
source bench/s54_device.sh
record
