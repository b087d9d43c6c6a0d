#!/usr/bin/env python3
"""Batch-1 generation speed of a skipless LM before and after weight removal (Graef,
arXiv:2404.12362; docs/TECHNIQUES.md#weight-removal).

Builds a skipless_lm model with generic random weights, converts it exactly with
slim_fairseq.weight_removal.reduce_model (drop Q and P by default), checks that both give the
same greedy tokens, and times greedy decoding one token at a time through fairseq's incremental
state (what fairseq-generate does per step, without the beam bookkeeping). Batch-1 decoding
reads every weight once per token, so it is memory-bound; the paper expects ~1.17-1.19x.
Prints a JSON summary: the conversion, weight counts, whether the greedy tokens agree, tokens/s
of both models and the speed-up.

Example:

    OMP_NUM_THREADS=1 python scripts/bench_skipless_generation.py --dim 1024 --layers 8 --tokens 64
    python scripts/bench_skipless_generation.py --device cuda --dim 4096 --layers 8 --dtype float16
"""
import argparse
import json
import os
import sys
import time
import types

from slim_fairseq_lab import command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_pair(opts):
    """(original, reduced) models of the requested shape, with generic weights."""
    from fairseq import utils
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    import torch
    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(REPO, "slim_fairseq")))
    from slim_fairseq.weight_removal import reduce_model

    args = argparse.Namespace(
        arch="skipless_lm", decoder_embed_dim=opts.dim, decoder_layers=opts.layers,
        decoder_attention_heads=opts.heads, kv_heads=opts.kv_heads, decoder_ffn_embed_dim=opts.ffn,
        ffn_glu=opts.ffn_glu, skipless_layout=opts.layout, max_target_positions=4096)
    if opts.ffn_glu:
        args.glu_hidden = "full"
    ARCH_CONFIG_REGISTRY["skipless_lm"](args)
    dictionary = Dictionary()
    for i in range(opts.vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY["skipless_lm"].build_model(args, types.SimpleNamespace(target_dictionary=dictionary))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(std=p.shape[-1] ** -0.5)
    model = model.double().eval()
    reduced, report = reduce_model(model, opts.removed)
    dtype = getattr(torch, opts.dtype)
    return model.to(opts.device, dtype).eval(), reduced.to(opts.device, dtype).eval(), report


def greedy(model, prompt, new_tokens):
    """Greedy decoding with incremental state; returns the generated token ids."""
    import torch
    with torch.no_grad():
        state = {}
        tokens = prompt
        logits = None
        for t in range(prompt.size(1)):  # feed the prompt one token at a time, as generation does
            logits = model(tokens[:, : t + 1], incremental_state=state)[0]
        out = []
        for _ in range(new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            tokens = torch.cat([tokens, nxt], dim=1)
            logits = model(tokens, incremental_state=state)[0]
        return torch.cat(out, dim=1)


def time_generation(model, prompt, new_tokens, repeats, device):
    """Tokens/s of greedy decoding (prompt and new tokens), the best of ``repeats`` runs."""
    import torch
    greedy(model, prompt, 4)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        greedy(model, prompt, new_tokens)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return (new_tokens + prompt.size(1)) / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=1024, help="model width (default 1024)")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    parser.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    parser.add_argument("--kv-heads", type=int, default=0, help="key/value heads (MQA/GQA); 0 = MHA (default)")
    parser.add_argument("--ffn", type=int, default=0, help="FFN width, 0 = 4 * dim (default)")
    parser.add_argument("--ffn-glu", action="store_true",
                        help="a GLU feed-forward of hidden width --ffn (default: a ReLU MLP)")
    parser.add_argument("--layout", default="serial", choices=["serial", "parallel"],
                        help="block layout (default serial)")
    parser.add_argument("--removed", default="q", choices=["q", "k", "v"],
                        help="the weight removed with P (default q)")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default 8000)")
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens fed before timing (default 8)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per run (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, best is reported (default 3)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="float32", help="torch dtype name, e.g. float16 (default float32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    opts = parser.parse_args(argv)
    import torch
    opts.ffn = opts.ffn or 4 * opts.dim
    if opts.threads:
        torch.set_num_threads(opts.threads)

    print(f"[bench_skipless] building skipless_lm d {opts.dim}, {opts.layers} layers, removing {opts.removed} "
          "and P", file=sys.stderr, flush=True)
    original, reduced, report = build_pair(opts)
    weights = lambda m: sum(p.numel() for p in m.parameters() if p.dim() > 1)  # noqa: E731
    prompt = torch.randint(4, opts.vocab, (1, opts.prompt), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(opts.device)
    same = torch.equal(greedy(original, prompt, 16), greedy(reduced, prompt, 16))
    results = {}
    for round_ in range(2):  # interleave the two models to even out machine noise
        for name, model in (("original", original), ("reduced", reduced)):
            tps = time_generation(model, prompt, opts.tokens, opts.repeats, opts.device)
            results[name] = max(results.get(name, 0.0), tps)
            print(f"[bench_skipless] round {round_ + 1}/2, {name}: {tps:,.1f} tokens/s", file=sys.stderr, flush=True)
    summary = {
        "device": opts.device if opts.device != "cuda" else torch.cuda.get_device_name(),
        "dtype": opts.dtype, "threads": torch.get_num_threads(),
        "shape": {k: getattr(opts, k) for k in ("dim", "layers", "heads", "kv_heads", "ffn", "ffn_glu", "layout", "vocab")},
        "removed": opts.removed, "conversion": report,
        "weights": {"original": weights(original), "reduced": weights(reduced)},
        "same_greedy_tokens": same,
        "tokens_per_s": {k: round(v, 2) for k, v in results.items()},
        "speedup": round(results["reduced"] / results["original"], 3),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
