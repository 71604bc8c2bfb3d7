#!/usr/bin/env python3
"""PyTorch DDP beside `helios train --nproc N`: Hugging Face GPT2LMHeadModel, random init,
fused AdamW, bf16 autocast, steady-state ms/step and tokens/s of the whole run (every rank's
batch), eager and with torch.compile. Run it alone for one GPU without DDP, or under
`torchrun --nproc_per_node N` for DDP over N GPUs (NCCL, PyTorch's default buckets, so the
all-reduce overlaps backward). Rank 0 prints one JSON line per mode on stdout.

    python3 bench/torch_ddp.py --case gpt2:12:8:1024
    torchrun --nproc_per_node 2 bench/torch_ddp.py --case gpt2:12:8:1024
"""

import argparse
import json
import os
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="gpt2:12:8:1024", help="name:layers:batch:seq per GPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", default="eager,compile")
    a = p.parse_args()
    try:
        import torch
        import torch.distributed as dist
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        sys.exit(f"missing Python package: {e.name}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    name, layers, batch, seq = a.case.split(":")
    layers, batch, seq = int(layers), int(batch), int(seq)
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=layers, n_head=12, n_embd=768, vocab_size=50257,
                         n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg).cuda().train()
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        torch.manual_seed(1 + rank)
        x = torch.randint(0, 50257, (batch, seq), device="cuda")

        def plain(ids):
            return model(ids, labels=ids).loss

        fwd = torch.compile(plain) if mode == "compile" else plain

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(4):
            step()
        times = []
        for _ in range(a.steps):
            torch.cuda.synchronize()
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        if rank == 0:
            print(json.dumps({
                "case": name, "mode": mode, "world": world, "batch_per_gpu": batch, "seq": seq,
                "ms_per_step": ms, "p95_ms": sorted(times)[int(0.95 * (len(times) - 1))],
                "tokens_per_s": world * batch * seq / (ms / 1e3),
                "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            }), flush=True)
        del model, opt
        torch.cuda.empty_cache()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
