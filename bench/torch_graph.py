#!/usr/bin/env python3
"""PyTorch side of `helios bench graph --compare torch`: the same cases, eager and with
torch.compile, timed the same way (host wall clock around torch.cuda.synchronize), printed as
one JSON document (`--json -`). Exits non-zero with a one-line reason when torch or CUDA is
missing.

Cases: chain1000 (µs per op of 1000 dependent ops on 1024 f32, then .cpu()), roundtrip (one op
and .cpu()), mixed32 (32 element-wise ops with a broadcast bias), mlp_block (GPT-2 MLP block
forward+backward, f32 and bf16; kernels per step from the profiler).
"""

import argparse
import json
import os
import re
import statistics
import sys
import time


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="-")
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--mixed", default="4096x4096")
    p.add_argument("--mlp", default="8192x768")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--cases", default="chain1000,roundtrip,mixed32,mlp_block",
                   help="comma-separated: chain1000, roundtrip, mixed32, mlp_block")
    p.add_argument("--quick", action="store_true")
    return p.parse_args(argv)


def timed(torch, fn, samples, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


# cuBLAS/CUTLASS GEMM kernels, by name (sm80_xmma_gemm_..., cutlass_80_simt_sgemm_..., nvjet_sm90_...).
MATMUL_KERNEL = re.compile(r"gemm|cutlass|xmma|cublas|nvjet", re.IGNORECASE)


def kernels(torch, fn, label=None):
    """Kernels one call of `fn` launches, and the share of their GPU time outside matrix
    products. With `label`, the per-kernel table goes to stderr."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    total = sum(e.device_time for e in events)
    outside = sum(e.device_time for e in events if not MATMUL_KERNEL.search(e.name))
    if label:
        print(f"{label}: {len(events)} kernels, {total:.1f} µs", file=sys.stderr)
        for e in sorted(events, key=lambda e: -e.device_time):
            print(f"  {e.device_time:9.1f} µs  {e.name[:110]}", file=sys.stderr)
    return float(len(events)), (outside / total if total > 0 else None)


def mixed_fn(torch, F, x, b):
    def run():
        y = F.gelu(x + b, approximate="tanh")
        for i in range(5):
            y = torch.clamp_min(y * (0.5 + 0.1 * i) + x, -1.0)
            y = torch.clamp_max(y - b, 1.0) + 0.25
        return y
    return run


def mlp_fn(torch, F, x, dy, gamma, beta, w1, b1, w2, b2):
    params = [x, gamma, beta, w1, b1, w2, b2]

    def run():
        h = F.layer_norm(x, (x.shape[-1],), gamma, beta, 1e-5)
        h = F.gelu(h @ w1 + b1, approximate="tanh")
        y = h @ w2 + b2 + x
        (y * dy).float().sum().backward()
        for p in params:
            p.grad = None
    return run


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        fail("python3 has no torch")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    dev = torch.device("cuda")
    results = []
    s = a.samples

    cases = set(a.cases.split(","))
    x = torch.rand(1024, device=dev)

    def chain():
        t = x
        for i in range(1000):
            t = t * 1.0001 if i % 2 == 0 else t - 0.0001
        t.cpu()
    if "chain1000" in cases:
        results.append({"case": "chain1000", "dtype": "f32",
                        "eager_us": timed(torch, chain, s) / 1000})
    if "roundtrip" in cases:
        results.append({"case": "roundtrip", "dtype": "f32",
                        "eager_us": timed(torch, lambda: (x + 1.0).cpu(), s * 40, 20)})

    if "mixed32" in cases:
        rows, cols = (int(v) for v in a.mixed.split("x"))
        xm = torch.rand(rows, cols, device=dev)
        bm = torch.rand(cols, device=dev)
        run = mixed_fn(torch, F, xm, bm)
        compiled = torch.compile(run)
        results.append({"case": "mixed32", "dtype": "f32", "eager_us": timed(torch, run, s),
                        "compile_us": timed(torch, compiled, s),
                        "eager_kernels": kernels(torch, run)[0],
                        "compile_kernels": kernels(torch, compiled)[0]})

    n, c = (int(v) for v in a.mlp.split("x"))
    for name in (a.dtypes.split(",") if "mlp_block" in cases else []):
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]
        mk = lambda *shape, scale=1.0: (torch.rand(*shape, device=dev) * scale).to(dt)
        x2, dy = mk(n, c).requires_grad_(), mk(n, c)
        tensors = [mk(c).requires_grad_(), (mk(c) * 0.1).requires_grad_(),
                   (mk(c, 4 * c) * 0.02).requires_grad_(), (mk(4 * c) * 0.02).requires_grad_(),
                   (mk(4 * c, c) * 0.02).requires_grad_(), (mk(c) * 0.02).requires_grad_()]
        run = mlp_fn(torch, F, x2, dy, *tensors)
        compiled = torch.compile(run)
        # HELIOS_PROFILE=1 (as for the helios side) prints each kernel's time.
        show = os.environ.get("HELIOS_PROFILE") == "1"
        eager_k, eager_out = kernels(torch, run, show and f"torch eager mlp_block {name}")
        comp_k, comp_out = kernels(torch, compiled, show and f"torch.compile mlp_block {name}")
        results.append({"case": "mlp_block", "dtype": name, "eager_us": timed(torch, run, s),
                        "compile_us": timed(torch, compiled, s),
                        "eager_kernels": eager_k, "compile_kernels": comp_k,
                        "eager_outside_mm": eager_out, "compile_outside_mm": comp_out})

    doc = {"meta": {"torch": torch.__version__, "cuda": torch.version.cuda,
                    "device": torch.cuda.get_device_name()}, "results": results}
    text = json.dumps(doc, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
