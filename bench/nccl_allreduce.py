#!/usr/bin/env python3
"""NCCL's all-reduce of GPT-2's gradients alone, with no Vulkan context in the process: the
floor under `helios train --nproc N`'s exchange (bf16, 124.44M parameters and the loss, in
place, as Helios sends them). Timed with CUDA events, median of 30 after 5 warm-ups; rank 0
prints one line. NCCL's variables (NCCL_ALGO, NCCL_PROTO, NCCL_MIN_NCHANNELS) are echoed.

    torchrun --nproc_per_node 2 bench/nccl_allreduce.py
"""

import os
import statistics

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    n = 124_440_000 + 64
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        dist.all_reduce(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    if rank == 0:
        ms = statistics.median(times)
        env = ",".join(
            f"{k}={os.environ[k]}"
            for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS")
            if k in os.environ
        )
        print(
            f"allreduce {n * 2 / 1e6:.0f} MB bf16 over {dist.get_world_size()} GPUs: median "
            f"{ms:.3f} ms, min {min(times):.3f}, {n * 2 / ms / 1e6:.0f} GB/s {env or '(defaults)'}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
