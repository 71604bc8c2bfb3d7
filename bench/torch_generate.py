#!/usr/bin/env python3
"""PyTorch side of `helios bench generate --compare torch`: Hugging Face GPT2LMHeadModel, random
init (no download), greedy `generate` with its KV cache (`use_cache=True`, eager), fp32 and bf16
weights, batch 1 and 8, the same prompt ids and number of new tokens as Helios. Each step is
stamped by a StoppingCriteria, which HF calls once per new token: it synchronizes CUDA and
reads `time.perf_counter()`. The first stamp gives the time to first token (prompt included),
the gaps between stamps the time per token. Everything runs twice in one process, "cold" then
"warm", as the Helios side does (only the very first cold call starts CUDA and cuBLAS). One
JSON document on stdout (`--json -`); exits non-zero with a one-line reason when torch,
transformers or CUDA is missing.
"""

import argparse
import copy
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
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--prompt", default="464,2068,7586,21831,18045,625,262,16931")
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--batches", default="1,8")
    return p.parse_args(argv)


def percentile(values, p):
    """Linear interpolation between order statistics, as NumPy and Helios's stats.rs do."""
    s = sorted(values)
    rank = p / 100 * (len(s) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def run_case(torch, hf, model, prompt, batch, n):
    stamps = []

    class Stamp(hf.StoppingCriteria):
        # Never stops generation; only records when each step's token exists.
        def __call__(self, input_ids, scores, **kwargs):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    ids = torch.tensor([prompt] * batch, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    # min_new_tokens keeps a random model's end-of-text token from stopping early.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         min_new_tokens=n, do_sample=False, use_cache=True,
                         pad_token_id=model.config.eos_token_id,
                         stopping_criteria=hf.StoppingCriteriaList([Stamp()]))
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    if out.shape[1] != len(prompt) + n:
        fail(f"generate made {out.shape[1] - len(prompt)} tokens, not {n}")
    if len(stamps) == n:
        timing = "per_step"
        per = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
        first = (stamps[0] - t0) * 1e3
    else:  # a transformers that does not call the criterion per step
        timing = "total/n"
        per = [total * 1e3 / n]
        first = per[0]
    ms = statistics.median(per)
    return {"batch": batch, "first_token_ms": first, "ms_per_token": ms,
            "p95_ms": percentile(per, 95), "max_ms": max(per),
            "tokens_per_s": batch / (ms / 1e3), "timing": timing}


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    try:
        import torch
        import transformers as hf
    except ImportError as e:
        fail(f"missing Python package: {e.name}")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    if a.new_tokens < 2:
        fail("--new-tokens must be at least 2 (the first token is timed apart)")
    torch.manual_seed(0)
    cfg = hf.GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd, n_positions=a.positions,
                     vocab_size=50257)
    base = hf.GPT2LMHeadModel(cfg).eval()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    precisions = a.precisions.split(",")
    # The same random weights in every precision, as Helios uploads one store.
    models = {p: copy.deepcopy(base).to(device="cuda", dtype=dtypes[p]) for p in precisions}
    prompt = [int(t) for t in a.prompt.split(",")]
    results = []
    with torch.inference_mode():
        for pass_ in ["cold", "warm"]:
            for precision in precisions:
                for batch in [int(b) for b in a.batches.split(",")]:
                    r = run_case(torch, hf, models[precision], prompt, batch,
                                 a.new_tokens)
                    r.update({"pass": pass_, "precision": precision})
                    print(json.dumps(r), file=sys.stderr)
                    results.append(r)
    doc = {"meta": {"torch": torch.__version__, "cuda": torch.version.cuda,
                    "transformers": hf.__version__,
                    "device": torch.cuda.get_device_name()},
           "results": results}
    text = json.dumps(doc, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
