#!/usr/bin/env python3
"""PyTorch side of `helios bench train --compare torch`: Hugging Face GPT2LMHeadModel, random
init, AdamW (fused), one batch of random ids or of the ids in `--ids`, steady-state ms/step,
tokens/s, the first step's time and peak device memory, eager and with torch.compile, fp32,
bf16 autocast, and f16 autocast with a GradScaler (dynamic loss scaling, as Helios does). One JSON document on stdout
(`--json -`); exits non-zero with a one-line reason when torch, transformers or CUDA is missing.

Cases are `name:layers:batch:seq`, e.g. `distilgpt2:6:8:512,gpt2:12:8:1024`.
"""

import argparse
import json
import statistics
import sys
import time


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="-")
    p.add_argument("--cases", default="distilgpt2:6:8:512,gpt2:12:8:1024")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--ids", default=None,
                   help="a file of little-endian u32 token ids; each case's batch is its first "
                        "batch*seq of them (default: random ids)")
    return p.parse_args(argv)


def read_ids(path):
    from array import array
    ids = array("I")
    if ids.itemsize != 4:
        ids = array("L")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder != "little":
        ids.byteswap()
    return list(ids)


def run_case(torch, GPT2Config, GPT2LMHeadModel, layers, batch, seq, precision, compiled, steps,
             ids=None):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if ids is None:
        x = torch.randint(0, 50257, (batch, seq), device="cuda")
    else:
        if len(ids) < batch * seq:
            fail(f"--ids holds {len(ids)} ids, fewer than a {batch}x{seq} batch")
        x = torch.tensor(ids[:batch * seq], dtype=torch.long, device="cuda").view(batch, seq)
    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "f16")

    def step():
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            loss = fwd(x)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    def plain(ids):
        return model(ids, labels=ids).loss

    fwd = torch.compile(plain) if compiled else plain
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    reserved = torch.cuda.max_memory_reserved() / 2**30
    del model, opt
    torch.cuda.empty_cache()
    return {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1e3), "first_step_s": first,
            "peak_gib": peak, "reserved_gib": reserved}


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        fail(f"missing Python package: {e.name}")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    ids = read_ids(a.ids) if a.ids else None
    results = []
    for case in a.cases.split(","):
        name, layers, batch, seq = case.split(":")
        for precision in a.precisions.split(","):
            for compiled in ([False] if a.no_compile else [False, True]):
                r = run_case(torch, GPT2Config, GPT2LMHeadModel, int(layers), int(batch), int(seq),
                             precision, compiled, a.steps, ids)
                r.update({"case": name, "precision": precision,
                          "mode": "compile" if compiled else "eager"})
                print(json.dumps(r), file=sys.stderr)
                results.append(r)
    doc = {"meta": {"torch": torch.__version__, "device": torch.cuda.get_device_name()},
           "results": results}
    text = json.dumps(doc, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
