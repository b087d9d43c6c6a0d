"""The architecture contract: what every model the plugin registers must do, on any device and in
any dtype (tests/test_contract.py runs it on the CPU in fp32, scripts/gpu_check.py on CUDA in
fp32, fp16 and bf16).

* :func:`check_gradients`: finite loss, every parameter gets a finite gradient;
* :func:`check_incremental`: incremental decoding == full forward, also after a beam reorder;
* :func:`check_no_future_leak`: changing a token changes no earlier output;
* :func:`check_padding_invariance`: a row alone == the same row in a padded batch;
* :func:`check_checkpoint_round_trip`: a fairseq checkpoint loads with ``weights_only=True``
  and gives the same outputs.

Each check raises ``AssertionError`` naming the architecture and what differs, and returns the
worst difference it measured (log-probabilities, in nats), so a report can show the margin.
Tolerances are per dtype (:data:`TOLERANCES`).
"""
import argparse
import copy
import os
import warnings
from dataclasses import dataclass

import torch

USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "slim_fairseq")

# fairseq's own models, built tiny: controls that show a check can pass (in a given dtype)
CONTROLS = {
    "transformer": (False, ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
                            "--encoder-layers", "2", "--encoder-attention-heads", "4",
                            "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
                            "--decoder-layers", "2", "--decoder-attention-heads", "4"]),
    "transformer_lm": (True, ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
                              "--decoder-layers", "2", "--decoder-attention-heads", "4"]),
}


@dataclass(frozen=True)
class Tolerance:
    """Largest differences of log-probabilities (nats) a check accepts in one dtype.

    ``match``: two computations of the same value that take different kernels or shapes
    (incremental step vs full forward, a row alone vs in a padded batch);
    ``leak``: how much an earlier position may move when a later token changes (a causal mask
    makes it exactly 0 in every dtype; the slack covers kernels whose reduction order depends
    on the row count)."""
    match: float
    leak: float


# fp32: rounding of a few hundred multiply-adds of O(1) values (eps 1.2e-7) stays far below 1e-5.
# fp16 (eps 9.8e-4) and bf16 (eps 7.8e-3): the model's activations and logits carry that
# relative rounding; a log-probability near -log(V) ~ -7 then moves by about 7 eps per rounding,
# and a few roundings stack up over the layers. A wrong cache, position or mask moves
# log-probabilities by tenths to whole nats, well above these bounds.
TOLERANCES = {
    torch.float32: Tolerance(match=1e-5, leak=1e-6),
    torch.float16: Tolerance(match=3e-2, leak=1e-3),
    torch.bfloat16: Tolerance(match=2e-1, leak=1e-2),
    # fp64 (eps 2.2e-16): the re-check of :func:`exact_up_to_fp32_rounding`
    torch.float64: Tolerance(match=1e-9, leak=1e-10),
}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def tolerance(dtype):
    """The :class:`Tolerance` of ``dtype`` (fp32, fp16, bf16)."""
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype {dtype} is not allowed; allowed: " + "|".join(DTYPES))
    return TOLERANCES[dtype]


# ---------------------------------------------------------------------------- building


def load_plugin():
    """Register the plugin with fairseq exactly as ``--user-dir`` does (never import it twice)."""
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=USER_DIR))


def build(arch, overrides, task_argv, extra=()):
    """(args, task, model) for ``arch`` built on the CPU through fairseq's training parser from
    ``task_argv`` (data directory and task flags) and CLI-style ``overrides``."""
    load_plugin()
    from fairseq import options, tasks
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        *task_argv, "--arch", arch, "--user-dir", USER_DIR, "--cpu", *overrides, *extra])
    task = tasks.setup_task(args)
    torch.manual_seed(1)
    model = task.build_model(args)
    return args, task, model


def fresh_copy(model):
    """A deep copy of ``model`` with incremental-state ids of its own (fairseq keys a module's
    cache by an id that ``copy.deepcopy`` would share with the original)."""
    copied = copy.deepcopy(model)
    for module in copied.modules():
        if hasattr(module, "init_incremental_state"):
            module.init_incremental_state()
    return copied


def plugin_archs():
    """Every architecture the plugin registers, with its model class (from fairseq's registry)."""
    load_plugin()
    from fairseq.models import ARCH_MODEL_REGISTRY
    return {arch: cls for arch, cls in sorted(ARCH_MODEL_REGISTRY.items())
            if cls.__module__.startswith("slim_fairseq")}


def is_lm(model_cls):
    from fairseq.models import FairseqLanguageModel
    return issubclass(model_cls, FairseqLanguageModel)


# the tiny shape every architecture is shrunk to for the contract (each side)
TINY = {"embed_dim": "32", "ffn_embed_dim": "48", "layers": "3", "attention_heads": "4"}


def tiny_overrides(arch):
    """Command-line overrides that shrink ``arch`` (any architecture of the plugin) to a tiny
    model of the same kind: :data:`TINY` on each side, more layers where tying needs them, and
    each technique's own sizes at that width (:func:`technique_overrides`). The contract suite
    (tests/test_contract.py) and the random combinations (tests/test_combinations.py) build
    every registered architecture so, with no test of its own."""
    load_plugin()
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    defaults = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](defaults)
    tiny = dict(TINY)
    offsets = [int(k) for k in (getattr(defaults, "tie_ffn", "none"),
                                getattr(defaults, "tie_attn_proj", "none")) if str(k) != "none"]
    if offsets:  # layers 1+K .. D-K-1 must hold two layers
        tiny["layers"] = str(max(3, 2 * max(offsets) + 3))
    lm = is_lm(ARCH_MODEL_REGISTRY[arch])
    out = []
    for side in ("decoder",) if lm else ("encoder", "decoder"):
        for key, value in tiny.items():
            out += [f"--{side}-{key.replace('_', '-')}", value]
    if lm:
        out += ["--decoder-input-dim", TINY["embed_dim"], "--decoder-output-dim", TINY["embed_dim"]]
    return out + technique_overrides(defaults)


def technique_overrides(defaults):
    """The sizes of the techniques an architecture's ``defaults`` turn on, at the tiny width."""
    out = []
    if getattr(defaults, "safe_embed_dim", 0):
        out += ["--safe-embed-dim", "16"]
    if getattr(defaults, "sandwich", False):
        out += ["--sandwich-dim", "48", "--sandwich-ffn-dim", "64", "--sandwich-heads", "4"]
    if getattr(defaults, "kv_heads", 0):
        out += ["--kv-heads", "2"]
    if getattr(defaults, "ffn_lora_rank", 0):
        out += ["--ffn-lora-rank", "4"]
    if getattr(defaults, "skipless_layout", "none") != "none" and getattr(defaults, "ffn_glu", False):
        # a skipless GLU stack squares the signal scale per block (degree-2 homogeneous):
        # down-weight the branch so the tiny model's log-probs stay O(log V) for fp32 checks
        out += ["--mlp-branch-scale", "0.5"]
    if getattr(defaults, "adaptive_input", False):
        out += ["--adaptive-input-cutoff", "20,60", "--adaptive-input-factor", "2"]
    if getattr(defaults, "adaptive_softmax_cutoff", None):
        out += ["--adaptive-softmax-cutoff", "20,60", "--adaptive-softmax-factor", "2",
                "--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
    return out


# ---------------------------------------------------------------------------- batches


def make_batch(task, lm, tgt_lens=(7, 7), src_lens=(9, 6), seed=0, device="cpu"):
    """(net_input, target): random in-vocabulary tokens; sources left-padded, targets
    right-padded as fairseq does."""
    from fairseq.data import data_utils
    d = task.target_dictionary
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(d.nspecial, len(d), (n,), generator=g) for n in tgt_lens]
    prev = data_utils.collate_tokens([torch.cat([torch.tensor([d.eos()]), r[:-1]]) for r in rows],
                                     d.pad(), left_pad=False)
    target = data_utils.collate_tokens(rows, d.pad(), left_pad=False).to(device)
    if lm:
        return {"src_tokens": prev.to(device), "src_lengths": torch.tensor(tgt_lens, device=device)}, target
    s = task.source_dictionary
    srcs = [torch.cat([torch.randint(s.nspecial, len(s), (n - 1,), generator=g),
                       torch.tensor([s.eos()])]) for n in src_lens]
    src = data_utils.collate_tokens(srcs, s.pad(), left_pad=True)
    return {"src_tokens": src.to(device), "src_lengths": torch.tensor(src_lens, device=device),
            "prev_output_tokens": prev.to(device)}, target


def training_sample(task, lm, device="cpu"):
    """A training sample whose targets sweep the vocabulary geometrically, so that every band of
    an adaptive input/softmax is used."""
    net_input, target = make_batch(task, lm, tgt_lens=(12, 9), device=device)
    d = task.target_dictionary
    sweep, k = [], d.nspecial
    while k < len(d) and len(sweep) < 11:
        sweep.append(k)
        k *= 2
    sweep.append(len(d) - 1)
    sweep = torch.tensor(sweep, device=device)
    prefix(net_input, lm)[0, 1: len(sweep) + 1] = sweep
    target[0, : len(sweep)] = sweep
    return {"id": torch.arange(target.size(0), device=device), "nsentences": target.size(0),
            "ntokens": int(target.ne(d.pad()).sum()), "net_input": net_input, "target": target}


def select(net_input, rows):
    return {k: v[rows.to(v.device)] for k, v in net_input.items()}


def prefix(net_input, lm):
    """The decoder's input tokens of a batch."""
    return net_input["src_tokens"] if lm else net_input["prev_output_tokens"]


def log_probs(model, net_input):
    return model.get_normalized_probs(model(**net_input), log_probs=True).float()


def incremental_log_probs(model, net_input, lm, reorder_at=None, new_order=None):
    """Decode one token at a time with fairseq's incremental state; optionally reorder the
    state (as beam search does) before step ``reorder_at``."""
    tokens = prefix(net_input, lm)
    enc = None if lm else model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    state = {}
    steps = []
    for t in range(tokens.size(1)):
        if t == reorder_at:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            tokens = tokens[new_order]
            if enc is not None:
                enc = model.encoder.reorder_encoder_out(enc, new_order)
        kwargs = {} if lm else {"encoder_out": enc}
        out = model.decoder(tokens[:, : t + 1], incremental_state=state, **kwargs)
        steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1].float())
    return steps


def _device(model):
    return next(model.parameters()).device


def _dtype(model):
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


# ---------------------------------------------------------------------------- checks


def check_gradients(arch, model, task, args, lm):
    """The criterion fairseq-train would use gives a finite loss, and every parameter a finite
    gradient (DDP would need --find-unused-parameters otherwise). Returns the loss."""
    sample = training_sample(task, lm, _device(model))
    criterion = task.build_criterion(args)
    model.train()
    model.zero_grad()
    try:
        loss, sample_size, _ = criterion(model, sample)
        assert torch.isfinite(loss) and sample_size > 0, f"{arch}: loss {loss.item()}"
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, f"{arch}: parameters without gradient (DDP would need " \
                            f"--find-unused-parameters): {missing}"
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"{arch}: non-finite gradients in {bad}"
        return loss.item()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


@torch.no_grad()
def check_incremental(arch, model, task, lm):
    """Step-by-step decoding with fairseq's incremental state (reordered before step 3 as beam
    search does) equals the full forward. Returns the largest difference."""
    model.eval()
    tol = tolerance(_dtype(model)).match
    net_input, _ = make_batch(task, lm, tgt_lens=(7, 7), seed=1, device=_device(model))
    full = log_probs(model, net_input)
    new_order = torch.tensor([1, 0, 1], device=_device(model))
    reordered_full = log_probs(model, select(net_input, new_order))
    steps = incremental_log_probs(model, net_input, lm, reorder_at=3, new_order=new_order)
    worst = 0.0
    for t, step in enumerate(steps):
        ref = full[:, t] if t < 3 else reordered_full[:, t]
        diff = (step - ref).abs().max().item()
        assert diff <= tol, f"{arch}: step {t} differs from the full forward by {diff:.3g} (tolerance {tol:g})"
        worst = max(worst, diff)
    return worst


class Fp32Excused(UserWarning):
    """An output check that missed the fp32 tolerance and passed on a float64 copy: the warning
    names the check, the model and the fp32 computation it excused (which step or row, by how
    much), so that a bug living only on an fp32 path is seen, not silently passed."""


def exact_up_to_fp32_rounding(check, arch, model, task, lm):
    """Run ``check`` (:func:`check_incremental`, :func:`check_no_future_leak` or
    :func:`check_padding_invariance`); when an fp32 model misses the fp32 tolerance, run it again
    on a float64 copy. fp32 rounding grows with the scale of the logits, and a model without norms
    (skipless blocks, most of all with a GLU, which squares the signal's scale) reaches tens of
    nats; in float64 that rounding vanishes while a wrong cache, mask or position does not. What
    float64 cannot see is a bug of a code path that runs in fp32 only: an excused miss warns
    :class:`Fp32Excused` with the fp32 failure it excused."""
    try:
        return check(arch, model, task, lm)
    except AssertionError as fp32_miss:
        if _dtype(model) != torch.float32:
            raise
        worst = check(arch, copy.deepcopy(model).double(), task, lm)
        missed = str(fp32_miss).splitlines()[0] if str(fp32_miss) else "failed"
        warnings.warn(Fp32Excused(
            f"{check.__name__} excused the fp32 path of {arch} as rounding ({missed}); the same "
            f"check passes on a float64 copy, worst {worst:.3g}"), stacklevel=2)
        return worst


@torch.no_grad()
def check_no_future_leak(arch, model, task, lm):
    """Changing token t changes no output before t, and does change outputs from t on.
    Returns the largest change before t."""
    model.eval()
    tol = tolerance(_dtype(model)).leak
    net_input, _ = make_batch(task, lm, tgt_lens=(8, 8), seed=2, device=_device(model))
    base = log_probs(model, net_input)
    d = task.target_dictionary
    worst = 0.0
    for t in (2, 5):
        changed = {k: v.clone() for k, v in net_input.items()}
        tokens = prefix(changed, lm)
        tokens[:, t] = d.nspecial + (tokens[:, t] - d.nspecial + 7) % (len(d) - d.nspecial)
        out = log_probs(model, changed)
        leak = (out[:, :t] - base[:, :t]).abs().max().item()
        assert leak <= tol, f"{arch}: changing token {t} changed earlier outputs by {leak:.3g} (tolerance {tol:g})"
        assert (out[:, t:] - base[:, t:]).abs().max().item() > 0, f"{arch}: the model ignores its input"
        worst = max(worst, leak)
    return worst


@torch.no_grad()
def check_padding_invariance(arch, model, task, lm):
    """Each row of a padded batch gives the outputs it gives alone. Returns the largest difference."""
    model.eval()
    tol = tolerance(_dtype(model)).match
    device = _device(model)
    net_input, _ = make_batch(task, lm, tgt_lens=(8, 4), src_lens=(10, 5), seed=3, device=device)
    batched = log_probs(model, net_input)
    worst = 0.0
    for row, length in ((0, 8), (1, 4)):
        alone_input = select(net_input, torch.tensor([row]))
        if lm:
            alone_input["src_tokens"] = alone_input["src_tokens"][:, :length]
        else:
            src = alone_input["src_tokens"]
            alone_input["src_tokens"] = src[:, src.ne(task.source_dictionary.pad())[0]]
            alone_input["prev_output_tokens"] = alone_input["prev_output_tokens"][:, :length]
        alone = log_probs(model, alone_input)
        diff = (alone[0, :length] - batched[row, :length]).abs().max().item()
        assert diff <= tol, f"{arch}: row {row} differs alone vs padded batch by {diff:.3g} (tolerance {tol:g})"
        worst = max(worst, diff)
    return worst


_SAVED_CFGS = {}


def saved_cfg(args):
    """fairseq's config of ``args`` as a checkpoint holds it; converted once per ``args`` object
    (the conversion composes hydra's config, about a second)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf
    kept = _SAVED_CFGS.get(id(args))
    if kept is None or kept[0] is not args:
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
        kept = _SAVED_CFGS[id(args)] = (args, cfg)
    return kept[1]


@torch.no_grad()
def check_checkpoint_round_trip(arch, model, task, args, lm, directory):
    """The model saved as fairseq-train saves it loads with ``weights_only=True`` and, back on
    the model's device and dtype, gives bit-identical outputs. Returns 0.0."""
    from fairseq import checkpoint_utils

    model.eval()
    state = {
        "cfg": saved_cfg(args),
        "args": None,
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 0},
        "last_optimizer_state": None,
    }
    path = os.path.join(str(directory), "checkpoint.pt")
    checkpoint_utils.torch_persistent_save(state, path)
    torch.load(path, weights_only=True)  # the file itself loads with safety on
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    loaded = models[0].to(device=_device(model), dtype=_dtype(model)).eval()
    net_input, _ = make_batch(task, lm, seed=4, device=_device(model))
    assert torch.equal(log_probs(model, net_input), log_probs(loaded, net_input)), \
        f"{arch}: the reloaded checkpoint gives other outputs"
    return 0.0


# the checks that compare two computations of the same values (the float64 re-check repeats them)
OUTPUT_CHECKS = ("incremental", "no_future_leak", "padding")


def recheck_in_float64(results, arch, model, task, lm):
    """Run every failed check of :data:`OUTPUT_CHECKS` in ``results`` (:func:`run_checks` of an
    fp32 model) again on a float64 copy of the model and add what it measured: ``float64``, its
    worst difference (None with ``float64_error`` when it fails there too). A check that passes
    in float64 missed in fp32 by rounding or by a kernel of reduced precision (TF32); one that
    fails in float64 too is wrong in every dtype."""
    failed = [name for name in OUTPUT_CHECKS if name in results and not results[name]["ok"]]
    if not failed:
        return results
    exact = copy.deepcopy(model).double()
    for name in failed:
        try:
            results[name]["float64"] = CHECKS[name](arch, exact, task, lm)
        except Exception as e:  # noqa: BLE001 -- reported next to the fp32 failure
            results[name]["float64"] = None
            results[name]["float64_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return results


# the checks in the order they run; gradients first (the eval-mode checks leave no state)
CHECKS = {
    "gradients": check_gradients,
    "incremental": check_incremental,
    "no_future_leak": check_no_future_leak,
    "padding": check_padding_invariance,
    "checkpoint": check_checkpoint_round_trip,
}


def run_checks(arch, model, task, args, lm, directory):
    """Every check of :data:`CHECKS` on ``model`` (already on its device and dtype), none
    stopping the others: {check: {"ok": bool, "value": float or None, "error": str or None}}."""
    results = {}
    for name, check in CHECKS.items():
        extra = {"gradients": (args, lm), "checkpoint": (args, lm, directory)}.get(name, (lm,))
        try:
            value = check(arch, model, task, *extra)
            results[name] = {"ok": True, "value": value, "error": None}
        except Exception as e:  # noqa: BLE001 -- a failed check is a result, reported with its message
            results[name] = {"ok": False, "value": None, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    return results
