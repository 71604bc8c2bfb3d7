#!/usr/bin/env python3
"""PyTorch side of `helios bench attention`: causal attention, forward and forward+backward,
through F.scaled_dot_product_attention and the naive form that stores the scores.

Timing as `helios bench attention`: CUDA events around K back-to-back ops (K so a sample lasts
~5 ms), per-op time = sample / K, median and p95 over the samples. Each op is captured once in
a CUDA graph and replayed, so the time is the GPU's alone, as Helios's timestamps are: called
eagerly, a forward+backward (autograd.grad) costs the host more than SDPA's kernels take,
and the figure measured the host (216 to 443 µs for one case across runs). Where capture
fails the op runs eagerly, and `timing` says which. SDPA gets q, k, v as
[B, H, T, D] leaves (its own layout); fwd+bwd is the forward then torch.autograd.grad with a
random dO. The naive form is softmax(scale·QKᵀ + mask)·V with the [B, H, T, T] scores stored
(f32 scores for f32 inputs, the input dtype otherwise). `backend` names the kernel family
SDPA ran (see `sdpa_backend`); `flash2_us` is SDPA with FlashAttention-2 forced (f16/bf16),
the reference on the instructions Helios's kernels use. Prints one JSON document with --json -.
"""

import argparse
import json
import math
import sys
import time


def fail(message):
    sys.stderr.write(f"torch_attention.py: {message}\n")
    sys.exit(1)


def summary(values):
    s = sorted(values)
    n = len(s)
    def pct(p):
        r = p / 100.0 * (n - 1)
        lo, hi = math.floor(r), math.ceil(r)
        return s[lo] + (s[hi] - s[lo]) * (r - lo)

    return pct(50), pct(95)


def sdpa_backend(fn):
    """Which kernels SDPA ran: the longest CUDA kernel of one call, named by family
    ("cudnn-wgmma" is cuDNN's Hopper kernel on the wgmma instructions, which Vulkan's
    cooperative matrices do not reach on NVIDIA's driver; "flash2" is FlashAttention-2 on
    mma.sync, the instructions Helios's kernels run on). None where the profiler fails."""
    import torch
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
        name = max(kernels, key=lambda e: e.device_time_total).key.lower()
    except Exception:  # noqa: BLE001 - the column is informative only
        return None
    if "cudnn" in name or "sdpa" in name:
        return "cudnn-wgmma" if "wgmma" in name else "cudnn"
    if "flash" in name:
        return "flash2"
    if "fmha" in name or "cutlass" in name or "efficient" in name:
        return "mem-efficient"
    return "math"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--shapes", default="8x12x512x64,8x12x1024x64,4x16x2048x128")
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--no-naive", action="store_true")
    a = p.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        fail("torch is not installed (pip install torch)")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    dev = torch.device("cuda", torch.cuda.current_device())
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    target, max_k = (1000.0, 2) if a.quick else (5000.0, 512)

    def graphed(fn):
        """`fn` replayed from a CUDA graph (GPU work only), else `fn` itself."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # capture wants its allocations warmed up off the main stream
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            return g.replay, "graph"
        except Exception:  # noqa: BLE001 - any capture failure falls back to eager calls
            torch.cuda.synchronize()
            return fn, "eager"

    def timed(fn):
        fn, how = graphed(fn)

        def sample(k):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(k):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / k

        sample(1)
        k = 2
        for _ in range(2):
            per = sample(k)
            k = max(1, min(max_k, math.ceil(target / per) if per > 0 else max_k))
        t0 = time.time()
        while time.time() - t0 < 0.3:
            sample(k)
        med, p95 = summary([sample(k) for _ in range(a.samples)])
        return med, p95, how

    results = []
    for shape in [s for s in a.shapes.split(",") if s]:
        b, h, t, d = (int(x) for x in shape.split("x"))
        for dname in [x for x in a.dtypes.split(",") if x]:
            dt = dtypes[dname]
            gen = torch.Generator(device=dev).manual_seed(1)
            mk = lambda: (torch.rand(b, h, t, d, device=dev, generator=gen) * 2 - 1).to(dt)
            q, k, v, do = mk(), mk(), mk(), mk()
            for x in (q, k, v):
                x.requires_grad_(True)
            scale = 1.0 / math.sqrt(d)
            mask = torch.ones(t, t, device=dev, dtype=torch.bool).tril()

            def sdpa():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def naive():
                s = (q @ k.transpose(-2, -1)) * scale
                s = s.masked_fill(~mask, float("-inf"))
                return torch.softmax(s.float(), dim=-1).to(dt) @ v

            for mode in [m for m in a.modes.split(",") if m]:
                def run(f):
                    if mode == "fwd":
                        def g():
                            with torch.no_grad():
                                f()
                        return g
                    return lambda: torch.autograd.grad(f(), (q, k, v), do)

                med, p95, how = timed(run(sdpa))
                backend = sdpa_backend(run(sdpa))
                # FlashAttention-2 forced: the same instruction class (mma.sync) as ours.
                flash_us = None
                if dt != torch.float32:
                    try:
                        from torch.nn.attention import SDPBackend, sdpa_kernel
                        def flash():
                            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                                return sdpa()
                        flash_us, _, _ = timed(run(flash))
                    except (ImportError, RuntimeError):
                        flash_us = None
                naive_us = None
                if not a.no_naive:
                    try:
                        naive_us, _, _ = timed(run(naive))
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                results.append({"case": mode, "dtype": dname, "shape": shape,
                                "median_us": med, "p95_us": p95, "naive_us": naive_us,
                                "flash2_us": flash_us, "backend": backend, "timing": how})
            del q, k, v, do
            torch.cuda.empty_cache()
    doc = {"suite": "attention", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(dev), "results": results}
    text = json.dumps(doc, indent=2) + "\n"
    if a.json == "-":
        sys.stdout.write(text)
    else:
        for r in results:
            sys.stdout.write(f"{r['case']:7} {r['dtype']:4} {r['shape']:16} sdpa {r['median_us']:9.1f} µs"
                             f"  naive {r['naive_us'] or float('nan'):9.1f} µs\n")
        if a.json:
            open(a.json, "w").write(text)


if __name__ == "__main__":
    main()
