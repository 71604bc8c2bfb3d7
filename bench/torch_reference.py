#!/usr/bin/env python3
"""PyTorch reference for `helios bench`: the same cases, measured the same way, on CUDA.

`helios bench <suite> --compare torch` runs this script with `--json -` and prints its figures
beside Helios's; run alone, it prints its own table. Key decisions, mirroring Helios's
methodology (crates/helios-cli/src/bench/):
- dispatch cases use host wall clocks around torch.cuda.synchronize(), tiny 1024-element f32
  tensors: `roundtrip` is one op plus `.cpu()` of its result (what Helios's `to_vec` does);
  `chain` is N dependent `t = t * 1.0001` then synchronize (per op = wall / N, and the time
  until the last op returned is the host "record" time); `independent` is N `x + i` kept alive
  in a list.
- bandwidth cases use CUDA events around K back-to-back ops (each output dropped, so the
  caching allocator reuses its memory), per op = elapsed / K, K chosen so a sample lasts about
  5 ms; inputs are random and rotate over enough tensors (256 MiB in all) that L2 cannot serve
  the 4M cases from the previous op.
- median, p95 (linear interpolation, as numpy) and coefficient of variation (sample standard
  deviation) are computed exactly as Helios does.
Without torch or a CUDA device it prints one line on stderr and exits with status 2.
"""

import argparse
import json
import math
import sys
import time

ELEMENTS = 1024  # dispatch suite tensor size, as in Helios
ROTATE_BYTES = 256 << 20
MAX_ROTATION = 32
OPS = ("copy", "add", "exp")


def fail(message):
    print(f"torch_reference.py: {message}", file=sys.stderr)
    sys.exit(2)


def parse_elements(text):
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    digits = text[:-1] if mult > 1 else text
    try:
        n = int(digits) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an element count (e.g. 4096, 64K, 4M)")
    if not 1 <= n <= 1 << 30:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be between 1 and 1G elements")
    return n


def positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=("dispatch", "bandwidth", "all", "matmul", "ops"),
                   default="all")
    p.add_argument("--json", metavar="PATH", help="write JSON to PATH ('-' for stdout, no table)")
    p.add_argument("--quick", action="store_true", help="few iterations, small sizes")
    p.add_argument("--sizes", type=lambda s: [parse_elements(x) for x in s.split(",") if x],
                   help="bandwidth sizes, comma-separated (default 4M,64M; --quick 64K)")
    p.add_argument("--dtypes", default="f32,f16", help="bandwidth dtypes (default f32,f16)")
    p.add_argument("--ops", type=positive, help="ops per chain/independent sample (default 1000)")
    p.add_argument("--samples", type=positive, help="samples of chain/independent (default 25)")
    p.add_argument("--roundtrip-iters", type=positive, help="round-trip iterations (default 2000)")
    p.add_argument("--bw-samples", type=positive, help="samples per bandwidth case (default 25)")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--mm-cases", default="", help="matmul cases name:m:n:k:ta:tb, comma-separated")
    p.add_argument("--mm-samples", type=positive, help="samples per matmul case (default 10)")
    p.add_argument("--ops-cases", default=",".join([*OPS_CASES, ADAMW_CASE]),
                   help="ops cases, comma-separated (default all: "
                        + ",".join([*OPS_CASES, ADAMW_CASE]) + ")")
    p.add_argument("--ops-shapes", default="",
                   help="ops shapes ROWSxCOLS, comma-separated (default 4096x768,4096x3072,"
                        "4096x50257; --quick 64x768,4x50257)")
    p.add_argument("--ops-samples", type=positive, help="samples per ops case (default 25)")
    args = p.parse_args(argv)
    q = args.quick
    args.sizes = args.sizes or ([64 << 10] if q else [4 << 20, 64 << 20])
    args.ops = args.ops or (100 if q else 1000)
    args.samples = args.samples or (3 if q else 25)
    args.roundtrip_iters = args.roundtrip_iters or (20 if q else 2000)
    args.bw_samples = args.bw_samples or (3 if q else 25)
    args.warmup = 1 if q else 3
    args.target_sample_us = 1000.0 if q else 5000.0
    args.max_k = 8 if q else 4096
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    allowed = ("f32", "f16", "bf16")
    for d in args.dtypes:
        if d not in allowed:
            p.error(f"unknown dtype {d!r}; use {' or '.join(allowed)}")
    args.mm_samples = args.mm_samples or (3 if q else 10)
    args.ops_samples = args.ops_samples or (3 if q else 25)
    shapes = args.ops_shapes or ("64x768,4x50257" if q else "4096x768,4096x3072,4096x50257")
    try:
        args.ops_shapes = [tuple(int(v) for v in s.lower().split("x")) for s in shapes.split(",") if s]
    except ValueError:
        p.error(f"--ops-shapes {shapes!r}: use ROWSxCOLS, comma-separated")
    args.ops_cases = [c for c in args.ops_cases.split(",") if c]
    for c in args.ops_cases:
        if c not in OPS_CASES and c != ADAMW_CASE:
            p.error(f"unknown ops case {c!r}; use {', '.join([*OPS_CASES, ADAMW_CASE])}")
    return args


# ---------------------------------------------------------------- statistics


def summary(values):
    s = sorted(values)
    n = len(s)

    def pct(p):
        rank = p / 100.0 * (n - 1)
        lo, hi = math.floor(rank), math.ceil(rank)
        return s[lo] + (s[hi] - s[lo]) * (rank - lo)

    mean = sum(s) / n
    cv = 0.0
    if n > 1 and mean != 0.0:
        cv = math.sqrt(sum((v - mean) ** 2 for v in s) / (n - 1)) / abs(mean)
    return {"median": pct(50), "p95": pct(95), "cv": cv, "mean": mean, "samples": n}


def row(suite, case, dtype, elements, times_us, **extra):
    st = summary(times_us)
    r = {"suite": suite, "case": case, "dtype": dtype, "elements": elements,
         "median_us": st["median"], "p95_us": st["p95"], "cv": st["cv"], "samples": st["samples"]}
    r.update({k: v for k, v in extra.items() if v is not None})
    return r


# ---------------------------------------------------------------- dispatch


def dispatch(torch, dev, a):
    sync = torch.cuda.synchronize
    x = torch.rand(ELEMENTS, device=dev) * 2 - 1
    results = []

    for _ in range(a.warmup * 10):
        (x + 1.0).cpu()
    times = []
    for _ in range(a.roundtrip_iters):
        t0 = time.perf_counter()
        (x + 1.0).cpu()
        times.append((time.perf_counter() - t0) * 1e6)
    results.append(row("dispatch", "roundtrip", "f32", ELEMENTS, times))

    def chain():
        sync()
        t0 = time.perf_counter()
        t = x
        for _ in range(a.ops):
            t = t * 1.0001
        rec = time.perf_counter() - t0
        sync()
        return time.perf_counter() - t0, rec

    def independent():
        sync()
        t0 = time.perf_counter()
        outs = [x + i for i in range(a.ops)]
        rec = time.perf_counter() - t0
        sync()
        total = time.perf_counter() - t0
        del outs
        return total, rec

    for name, fn in (("chain", chain), ("independent", independent)):
        for _ in range(a.warmup):
            fn()
        totals, recs = [], []
        for _ in range(a.samples):
            total, rec = fn()
            totals.append(total * 1e6 / a.ops)
            recs.append(rec * 1e6 / a.ops)
        results.append(row("dispatch", name, "f32", ELEMENTS, totals,
                           record_us=summary(recs)["median"], ops_per_sample=a.ops))
    return results


# ---------------------------------------------------------------- bandwidth


def bandwidth(torch, dev, a):
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    gen = torch.Generator(device=dev).manual_seed(0)
    results = []
    for n in a.sizes:
        for dname in a.dtypes:
            dt = dtypes[dname]
            size = torch.empty((), dtype=dt).element_size()
            copy_gbps = None
            for op in OPS:
                inputs = 2 if op == "add" else 1
                count = max(1, min(MAX_ROTATION, -(-ROTATE_BYTES // max(1, inputs * n * size))))
                sets = [[(torch.rand(n, device=dev, generator=gen) * 2 - 1).to(dt)
                         for _ in range(inputs)] for _ in range(count)]
                fn = {"copy": lambda s: s[0].clone(),
                      "add": lambda s: s[0] + s[1],
                      "exp": lambda s: torch.exp(s[0])}[op]

                def sample(k):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    for i in range(k):
                        fn(sets[i % count])
                    end.record()
                    end.synchronize()
                    return start.elapsed_time(end) * 1e3 / k  # ms -> µs per op

                sample(2)
                probe = sample(max(1, min(4, a.max_k)))
                k = a.max_k if probe <= 0 else math.ceil(a.target_sample_us / probe)
                k = max(1, min(a.max_k, k))
                sample(k)
                times = [sample(k) for _ in range(a.bw_samples)]
                nbytes = (inputs + 1) * n * size
                med = summary(times)["median"]
                gbps = nbytes / (med * 1e-6) / 1e9 if med > 0 else None
                if op == "copy":
                    copy_gbps = gbps
                pct = 100.0 * gbps / copy_gbps if gbps and copy_gbps else None
                results.append(row("bandwidth", op, dname, n, times, gbps=gbps,
                                   pct_of_copy=pct, ops_per_sample=k, bytes_per_op=nbytes))
                del sets
    return results


# ---------------------------------------------------------------- matmul


def parse_mm_cases(text):
    cases = []
    for item in filter(None, text.split(",")):
        name, m, n, k, ta, tb = item.split(":")
        cases.append((name, int(m), int(n), int(k), ta == "1", tb == "1"))
    return cases


def matmul_suite(torch, dev, a):
    """`torch.matmul` on Helios's matmul cases (TF32 off), timed with CUDA events like
    `helios bench matmul`: K back-to-back products per sample, K so a sample lasts ~5 ms;
    relative error against float64 on 8 evenly spaced rows (every column up to 8192)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    results = []
    for name, m, n, k, ta, tb in parse_mm_cases(a.mm_cases):
        for dname in a.dtypes:
            dt = dtypes[dname]
            gen = torch.Generator(device=dev).manual_seed(1234)
            A = (torch.rand(m, k, device=dev, generator=gen) * 2 - 1).to(dt)
            B = (torch.rand(k, n, device=dev, generator=gen) * 2 - 1).to(dt)
            if ta:  # stored k×m, read transposed
                A = A.t().contiguous().t()
            if tb:
                B = B.t().contiguous().t()
            C = torch.matmul(A, B)
            rows = [i * (m - 1) // 7 for i in range(8)]
            cols = torch.arange(0, n, -(-n // 8192), device=dev)
            ref = A[rows].double() @ B[:, cols].double()
            got = C[rows][:, cols].double()
            rel = float((got - ref).norm() / ref.norm())
            del C

            def sample(reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(reps):
                    torch.matmul(A, B)
                end.record()
                end.synchronize()
                return start.elapsed_time(end) * 1e3 / reps

            sample(1)
            probe = sample(2)
            reps = max(1, min(100, math.ceil(5000.0 / max(probe, 1e-3))))
            times = [sample(reps) for _ in range(a.mm_samples)]
            med = summary(times)["median"]
            tflops = 2.0 * m * n * k / (med * 1e-6) / 1e12
            results.append(row("matmul", name, dname, m * n * k, times, tflops=tflops,
                               rel_err=rel, ops_per_sample=reps))
            del A, B
    return results


# ---------------------------------------------------------------- ops


def _layer_norm_fwdbwd(torch, F, x, g, b, dy):
    xg = x.detach().requires_grad_(True)
    gg = g.detach().requires_grad_(True)
    bg = b.detach().requires_grad_(True)

    def run():
        y = F.layer_norm(xg, (x.shape[-1],), gg, bg, 1e-5)
        y.backward(dy)
        xg.grad = gg.grad = bg.grad = None
    return run


def _cross_entropy_fwdbwd(torch, F, x, g, b, dy):
    xg = x.detach().requires_grad_(True)
    gen = torch.Generator(device=x.device).manual_seed(9)
    t = torch.randint(0, x.shape[-1], (x.shape[0],), device=x.device, generator=gen)

    def run():
        F.cross_entropy(xg, t).backward()
        xg.grad = None
    return run


# The ops cases, as in `helios bench ops` (crates/helios-cli/src/bench/ops.rs, `CASES`): name ->
# make(torch, F, x, gamma, beta, dy) returning a function that runs one op. Add a case here and
# there with the same name. Byte counts (for GB/s) are Helios's, applied to these times.
OPS_CASES = {
    "softmax": lambda torch, F, x, g, b, dy: lambda: torch.softmax(x, -1),
    "layernorm_fwd": lambda torch, F, x, g, b, dy:
        lambda: F.layer_norm(x, (x.shape[-1],), g, b, 1e-5),
    "layernorm_fwdbwd": _layer_norm_fwdbwd,
    "cross_entropy_fwdbwd": _cross_entropy_fwdbwd,
    "transpose": lambda torch, F, x, g, b, dy: lambda: x.t().contiguous(),
    "sum_all": lambda torch, F, x, g, b, dy: lambda: x.sum(),
    "sum_last": lambda torch, F, x, g, b, dy: lambda: x.sum(-1),
}
OPS_NEED_DY = ("layernorm_fwdbwd",)
# Outside the table (its own inputs, once per dtype): torch.optim.AdamW(fused=True) over GPT-2
# 124M's parameters, as `helios bench ops` runs `adamw_step`.
ADAMW_CASE = "adamw_gpt2"


def gpt2_parameters(quick):
    """GPT-2 124M's 148 parameter shapes (ops.rs `gpt2_parameters` lists the same); --quick:
    one block and a 256-token vocabulary."""
    vocab, layers, c = (256, 1, 768) if quick else (50257, 12, 768)
    p = [(vocab, c), (1024, c)]
    for _ in range(layers):
        p += [(c,), (c,), (c, 3 * c), (3 * c,), (c, c), (c,), (c,), (c,), (c, 4 * c), (4 * c,),
              (4 * c, c), (c,)]
    return p + [(c,), (c,)]


def adamw_case(torch, dev, dname, a, target, max_k):
    """One fused AdamW step over GPT-2's parameters, weight decay 0.1 on matrices, 0 on
    vectors. f32: everything f32, as Helios. bf16: PyTorch's fused AdamW keeps parameters,
    gradients and moments in bf16 (it has no f32-master mode); Helios keeps f32 master weights
    and moments, reads bf16 gradients and writes a bf16 copy."""
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dname]
    gen = torch.Generator(device=dev).manual_seed(11)
    params = []
    for shape in gpt2_parameters(a.quick):
        p = torch.nn.Parameter((torch.rand(shape, device=dev, generator=gen) * 2 - 1).to(dt))
        p.grad = (torch.rand(shape, device=dev, generator=gen) * 2 - 1).to(dt)
        params.append(p)
    groups = [{"params": [p for p in params if p.dim() > 1], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, fused=True)
    n = sum(p.numel() for p in params)

    def sample(k):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(k):
            opt.step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / k

    sample(2)
    k = min(4, max_k)
    for _ in range(2):
        per = sample(k)
        k = max(1, min(max_k, math.ceil(target / per) if per > 0 else max_k))
    times = [sample(k) for _ in range(a.ops_samples)]
    r = row("ops", ADAMW_CASE, dname, n, times, ops_per_sample=k)
    r.update({"rows": 1, "cols": n})
    del opt, params
    return r


def ops_suite(torch, dev, a):
    """The ops cases timed like `helios bench ops`: CUDA events around K back-to-back ops
    (K so a sample lasts ~5 ms), inputs rotating over 256 MiB of copies, outputs dropped."""
    import torch.nn.functional as F
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    results = []
    target, max_k = (1000.0, 4) if a.quick else (5000.0, 2048)
    table_cases = [c for c in a.ops_cases if c in OPS_CASES]
    for rows, cols in a.ops_shapes if table_cases else []:
        for dname in a.dtypes:
            dt = dtypes[dname]
            gen = torch.Generator(device=dev).manual_seed(7)
            size = torch.empty((), dtype=dt).element_size()
            need_dy = any(c in OPS_NEED_DY for c in a.ops_cases)
            per_set = rows * cols * size * (2 if need_dy else 1)
            count = max(1, min(MAX_ROTATION, -(-ROTATE_BYTES // max(1, per_set))))
            x0 = (torch.rand(rows, cols, device=dev, generator=gen) * 2 - 1).to(dt)
            g = (1 + 0.5 * (torch.rand(cols, device=dev, generator=gen) * 2 - 1)).to(dt)
            b = (torch.rand(cols, device=dev, generator=gen) * 2 - 1).to(dt)
            dy0 = ((torch.rand(rows, cols, device=dev, generator=gen) * 2 - 1).to(dt)
                   if need_dy else None)
            sets = [(x0.clone(), None if dy0 is None else dy0.clone()) for _ in range(count)]
            for case in table_cases:
                fns = [OPS_CASES[case](torch, F, x, g, b, dy) for x, dy in sets]

                def sample(k):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    for i in range(k):
                        fns[i % count]()
                    end.record()
                    end.synchronize()
                    return start.elapsed_time(end) * 1e3 / k

                with torch.enable_grad():
                    sample(2)
                    k = min(4, max_k)
                    for _ in range(2):
                        per = sample(k)
                        k = max(1, min(max_k, math.ceil(target / per) if per > 0 else max_k))
                    times = [sample(k) for _ in range(a.ops_samples)]
                r = row("ops", case, dname, rows * cols, times, ops_per_sample=k)
                r.update({"rows": rows, "cols": cols})
                results.append(r)
            del sets, x0, dy0
    if ADAMW_CASE in a.ops_cases:
        for dname in a.dtypes:
            results.append(adamw_case(torch, dev, dname, a, target, max_k))
    return results


# ---------------------------------------------------------------- output


def table(doc):
    lines = [f"torch {doc['torch']} (CUDA {doc['cuda']}) on {doc['device']}"]
    for r in doc["results"]:
        fig = (f"{r['gbps']:8.0f} GB/s  {r.get('pct_of_copy') or 0:5.1f}% copy"
               if r.get("gbps") else
               f"{r['tflops']:8.1f} TFLOP/s  err {r['rel_err']:.1e}" if "tflops" in r else
               f"record {r['record_us']:.3f} µs/op" if "record_us" in r else "")
        lines.append(f"{r['suite']:9} {r['case']:12} {r['dtype']:3} {r['elements']:>10}  "
                     f"median {r['median_us']:10.3f} µs  p95 {r['p95_us']:10.3f}  "
                     f"CV {100 * r['cv']:5.1f}%  {fig}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError:
        fail("torch is not installed (pip install torch)")
    if not a.device.startswith("cuda"):
        fail(f"--device {a.device}: only CUDA devices are measured")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    dev = torch.device(a.device)
    if dev.index is None:
        # torch.cuda.set_device wants an index: plain "cuda" means the current device.
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    doc = {
        "suite": a.suite,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev),
        "python": sys.version.split()[0],
        "results": [],
    }
    with torch.no_grad():
        if a.suite in ("dispatch", "all"):
            doc["results"] += dispatch(torch, dev, a)
        if a.suite in ("bandwidth", "all"):
            doc["results"] += bandwidth(torch, dev, a)
        if a.suite == "matmul":
            doc["results"] += matmul_suite(torch, dev, a)
        if a.suite == "ops":
            doc["results"] += ops_suite(torch, dev, a)
    text = json.dumps(doc, indent=2) + "\n"
    if a.json == "-":
        sys.stdout.write(text)
        return
    sys.stdout.write(table(doc))
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
