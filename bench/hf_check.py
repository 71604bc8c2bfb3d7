#!/usr/bin/env python3
"""Does a checkpoint Helios saved load in Hugging Face `transformers` and give the same loss?

Usage (where torch and transformers are installed, e.g. the GPU machine):
    bench/hf_check.py CHECKPOINT_DIR REFERENCE.safetensors

CHECKPOINT_DIR is what `helios train --out DIR` wrote under DIR/checkpoint (config.json and
model.safetensors, HF's own names and layout). REFERENCE holds `inputs` and `targets` (B, T
int32), Helios's `loss` (1) and `logits` (B, T', V f32, the first T' positions of each row),
cut from a `helios train --init CHECKPOINT_DIR/model.safetensors --dump-state FILE` of the
same checkpoint. The model is loaded with `GPT2LMHeadModel.from_pretrained` in fp32 (TF32
off), run on `inputs`, and its mean cross-entropy and logits are compared with Helios's.
Exit status 1 when the loss differs by more than 1e-4 relative or the logits by more than
1e-3 of their largest magnitude.
"""

import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("reference")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = load_file(args.reference)
    model = GPT2LMHeadModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32)
    model.to(dev).eval()
    inputs = ref["inputs"].long().to(dev)
    targets = ref["targets"].long().to(dev)
    with torch.no_grad():
        logits = model(inputs).logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    ).item()
    want = ref["loss"].item()
    t = ref["logits"].shape[1]
    got_logits = logits[:, :t, :].cpu()
    scale = ref["logits"].abs().max().item()
    logit_err = (got_logits - ref["logits"]).abs().max().item() / scale
    loss_err = abs(loss - want) / abs(want)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, {dev}")
    print(f"loss: transformers {loss:.6f}, helios {want:.6f}, relative difference {loss_err:.2e}")
    print(f"logits ({tuple(got_logits.shape)}): max |difference| / max |logit| = {logit_err:.2e}")
    ok = loss_err <= 1e-4 and logit_err <= 1e-3
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
