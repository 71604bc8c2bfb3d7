#!/usr/bin/env python3
"""A PyTorch reference for Helios' GPT-2: one small model, one batch, everything in fp32.

Writes one safetensors file (default crates/helios-nn/tests/data/gpt2_ref.safetensors):

  <name>          the initial weights, Hugging Face names without `transformer.` (Conv1D [in, out])
  grad.<name>     d loss / d weight for the batch (wte's includes the tied head's share)
  inputs          (B, T) int32 token ids
  targets         (B, T) int32 next-token ids
  logits          (B, T, V) fp32
  loss            (1,) mean cross-entropy over B*T positions
  losses          (STEPS,) the loss before each of STEPS AdamW steps on the same batch
                  (losses[0] == loss)

and in the file's metadata (strings): `config` (GPT2Config as JSON), `adamw` (lr, betas, eps,
weight decay, which parameters decay), `steps`, `seed`, versions. The model is tiny (2 layers,
2 heads, 64 channels, 64 positions) with a 512-token vocabulary so the file stays near 1.2 MB;
GPT-2's real vocabulary would make wte alone 12.9 MB.

Runs on CPU torch (the default) or `--device cuda` (TF32 off). With `--check-helios DIR ...`
it also loads directories Helios wrote (`save_pretrained` / `save_checkpoint`) with
`GPT2LMHeadModel.from_pretrained` and checks every weight against the file, and it reports
which tensor names `save_pretrained` itself writes.

  python3 bench/gpt2_reference.py [--out PATH] [--device cpu|cuda] [--check-helios DIR ...]
"""

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch
import torch.nn.functional as F

SEED = 1337
B, T = 2, 16
STEPS = 10
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
CONFIG = dict(
    vocab_size=512,
    n_positions=64,
    n_embd=64,
    n_layer=2,
    n_head=2,
    activation_function="gelu_new",
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    layer_norm_epsilon=1e-5,
    initializer_range=0.02,
    tie_word_embeddings=True,
)


def build_model(device):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    cfg = GPT2Config(**CONFIG)
    try:
        model = GPT2LMHeadModel(cfg, attn_implementation="eager")
    except TypeError:  # older transformers
        cfg._attn_implementation = "eager"
        model = GPT2LMHeadModel(cfg)
    return cfg, model.to(device).float()


def named_params(model):
    """Parameters by Hugging Face name without the `transformer.` prefix (tied head once)."""
    out = {}
    for name, p in model.named_parameters():
        name = name[len("transformer."):] if name.startswith("transformer.") else name
        assert name != "lm_head.weight", "the head should be tied to wte"
        out[name] = p
    return out


def loss_of(model, inputs, targets):
    logits = model(input_ids=inputs).logits  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def reference(device):
    cfg, model = build_model(device)
    model.train()  # dropout is 0: train and eval agree
    params = named_params(model)
    out = {n: p.detach().cpu().clone().contiguous() for n, p in params.items()}

    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    inputs_d, targets_d = inputs.to(device), targets.to(device)

    logits, loss = loss_of(model, inputs_d, targets_d)
    loss.backward()
    for n, p in params.items():
        out["grad." + n] = p.grad.detach().cpu().clone().contiguous()
    out["inputs"] = inputs.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["logits"] = logits.detach().cpu().contiguous()
    out["loss"] = loss.detach().cpu().reshape(1)

    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": ADAMW["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=ADAMW["lr"],
        betas=(ADAMW["beta1"], ADAMW["beta2"]),
        eps=ADAMW["eps"],
        foreach=False,
        fused=False,
    )
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = loss_of(model, inputs_d, targets_d)
        losses.append(l.item())
        l.backward()
        opt.step()
    out["losses"] = torch.tensor(losses, dtype=torch.float32)

    import transformers

    metadata = {
        "format": "pt",
        "config": json.dumps(CONFIG, sort_keys=True),
        "adamw": json.dumps(
            {**ADAMW, "decay": "parameters with dim >= 2 (the matrices)", "grad_clip": None},
            sort_keys=True,
        ),
        "steps": str(STEPS),
        "seed": str(SEED),
        "batch": json.dumps({"B": B, "T": T, "same_batch_every_step": True}),
        "loss": "mean cross-entropy over B*T positions; losses[i] is the loss before step i",
        "versions": json.dumps(
            {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(device)}
        ),
    }
    return out, metadata, model


def check_names_written_by_transformers(model):
    """Prints which names save_pretrained writes, and checks from_pretrained reads both forms."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
            meta = f.metadata()
        print(f"save_pretrained writes {len(keys)} tensors, e.g. {keys[:3]}; lm_head present: "
              f"{'lm_head.weight' in keys}; metadata {meta}")
        # The same weights without the prefix (the published `gpt2` checkpoint's form).
        sd = {n: p.detach().cpu().contiguous() for n, p in named_params(model).items()}
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        m2, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
        same = all(torch.equal(sd[n], p.detach().cpu()) for n, p in named_params(m2).items())
        print(f"from_pretrained of unprefixed names: equal={same} missing={info['missing_keys']} "
              f"unexpected={info['unexpected_keys']}")


def check_helios(dirs, inputs):
    """Loads each Helios-written directory with from_pretrained; every weight must match."""
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    ok = True
    for d in dirs:
        stored = load_file(os.path.join(d, "model.safetensors"))
        model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
        model.eval()
        mine = named_params(model)
        bad = [n for n, t in stored.items()
               if not torch.equal(t.float(), mine[n.removeprefix("transformer.")].detach().float())]
        tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        with torch.no_grad():
            logits = model(input_ids=inputs.long()).logits
        good = (not bad and not info["missing_keys"] and not info["unexpected_keys"] and tied
                and bool(torch.isfinite(logits).all()))
        ok &= good
        print(f"helios {d}: {'OK' if good else 'FAILED'} tensors={len(stored)} "
              f"dtype={next(iter(stored.values())).dtype} mismatched={bad[:3]} "
              f"missing={info['missing_keys']} unexpected={info['unexpected_keys']} tied={tied} "
              f"logits={tuple(logits.shape)}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="crates/helios-nn/tests/data/gpt2_ref.safetensors")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--check-helios", nargs="*", default=[], metavar="DIR")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    from safetensors.torch import save_file

    out, metadata, model = reference(torch.device(args.device))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(out, args.out, metadata=metadata)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {len(out)} tensors, {size} bytes; loss {out['loss'].item():.6f}, "
          f"losses {[round(x, 4) for x in out['losses'].tolist()]}")
    print("metadata:", json.dumps(metadata))

    check_names_written_by_transformers(model.cpu())
    if args.check_helios and not check_helios(args.check_helios, out["inputs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
