"""Which transformers class a model goes to, and the one-line refusal of what no class holds
(README, "Use your model outside fairseq"; docs/DESIGN.md, "Export to transformers").

The refusals come before anything is written or transformers is imported. One line names
every option in the way, each with its problem, and what to train with instead (all the
changes at once, so that one retraining exports); the techniques that change the block's computation
(Anthe's gates, H-SoftPOS, SAFE, a sandwich middle of another width, adaptive input and softmax,
skipless blocks with shaped attention) have no counterpart in any stock class. Skipless
language models, language models with Anthe's gates or H-SoftPOS and translation models with
Anthe's or the Subformer's techniques leave as custom code (:mod:`.skipless`, :mod:`.anthe`,
:mod:`.seq2seq`), whose own check lists what it computes.
"""
from slim_fairseq import options as vocabulary
from slim_fairseq.models import slim_options
from slim_fairseq.models.slim_options import SandwichOptions
from slim_fairseq.export_hf.layers import normformer_scales
from slim_fairseq.option_errors import OptionError, option_error, refusal

# (option, whether it is on, what no class has, what to train with instead)
NO_CLASS = (
    ("self_attn_gate", lambda v: v not in (None, "none"), "--self-attn-gate",
     "Anthe's gated attention (sigmoid(W x) * W' y) is in no transformers class",
     "--self-attn-gate none"),
    ("cross_attn_gate", lambda v: v not in (None, "none"), "--cross-attn-gate",
     "Anthe's gated attention (sigmoid(W x) * W' y) is in no transformers class",
     "--cross-attn-gate none"),
    ("no_patt", bool, "--no-patt",
     "attention without the projections W_Q, W_K, W_V is in no transformers class",
     "the projections (no --no-patt)"),
    ("hsoftpos_levels", bool, "--hsoftpos-levels",
     "H-SoftPOS embeddings (convolutions over neighbouring tokens) are in no transformers class",
     "--hsoftpos-levels 0"),
    ("safe_embed_dim", bool, "--safe-embed-dim",
     "SAFE's factorised embeddings (an attention inside the embedding) are in no transformers "
     "class", "--safe-embed-dim 0"),
    ("output_bias", bool, "--output-bias",
     "no class here has a bias on the vocabulary projection", "no --output-bias"),
    ("adaptive_input", bool, "--adaptive-input",
     "an adaptive input (one table per frequency band) is in no class here",
     "one token table (no --adaptive-input)"),
    ("adaptive_softmax_cutoff", lambda v: bool(v), "--adaptive-softmax-cutoff",
     "an adaptive softmax is in no class here", "one output projection (no "
     "--adaptive-softmax-cutoff)"),
    ("skipless_layout", lambda v: v not in (None, "none"), "--skipless-layout",
     "blocks without skips or norms, with shaped attention, are in no transformers class",
     "--skipless-layout none"),
    ("layernorm_embedding", bool, "--layernorm-embedding",
     "no class here normalises the embedding before the first layer",
     "no --layernorm-embedding"),
    ("norm", lambda v: v == "none", "--norm",
     "every class here normalises its blocks", "--norm layernorm|rmsnorm"),
    ("cross_self_attention", bool, "--cross-self-attention",
     "no class here attends to source and target in one attention",
     "no --cross-self-attention"),
    ("no_cross_attention", bool, "--no-cross-attention",
     "a decoder without encoder attention is in no sequence-to-sequence class here",
     "no --no-cross-attention"),
    ("character_embeddings", bool, "--character-embeddings",
     "character embeddings are in no class here", "no --character-embeddings"),
)



def _shown(value):
    return None if value is True else value


class Refusals:
    """The refusals of one export, gathered so that one line names every option in the way."""

    def __init__(self):
        self.found = []

    def add(self, error):
        self.found.append(error)

    def run(self, check, *args):
        """``check(*args)``, its refusal kept. Once an option is already in the way, a later
        check, written for a model some class holds, may fail on it otherwise: only its one-line
        refusals count then."""
        try:
            return check(*args)
        except OptionError as error:
            self.add(error)
        except Exception:
            if not self.found:
                raise
        return None

    def each(self, problems, src):
        """Keep every refusal that the generator ``problems(src)`` yields (a layout's check)."""
        self.run(lambda: self.found.extend(problems(src)))

    def raise_all(self):
        """Raise one :class:`OptionError` naming every refusal (the first's line alone when it is
        the only one); nothing when there is none."""
        if self.found:
            raise combined(self.found)


def combined(errors):
    """One refusal of ``errors`` (each ``SUBJECT: problem; allowed: what works``): every subject,
    every problem, and a model trained with every change at once."""
    parts = {}  # subject: [problem, allowed]; a subject named twice keeps its first problem and
    # its last advice (a class's check, after the checks of what no class holds, is narrower)
    for error in errors:
        head, allowed = str(error).rsplit("; allowed: ", 1)
        subject, problem = head.split(": ", 1)
        parts.setdefault(subject, [problem, allowed])[1] = allowed
    if len(parts) == 1 and len(errors) == 1:
        return errors[0]
    if len(parts) == 1:
        (subject, (problem, allowed)), = parts.items()
        return refusal(subject, problem, allowed)
    parts = [(s, p, a) for s, (p, a) in parts.items()]
    return refusal(", ".join(s for s, _, _ in parts),
                   f"{len(parts)} options are in the way: "
                   + "; ".join(f"{s}: {p}" for s, p, _ in parts),
                   "a model trained with all of " + ", and ".join(a for _, _, a in parts))


def known(spec_cls):
    """Whether the export knows the technique of ``spec_cls``: a spec of the plugin's own
    (``models/slim_options.py``), each of whose options the checks here either map to a class
    or refuse. A technique registered from outside is known to no layout (the allow-list)."""
    return spec_cls.__module__ == slim_options.__name__


def check_known_techniques(src, refusals):
    """Refuse every option on of a technique the export does not know, and a norm registered
    from outside."""
    from slim_fairseq.models.slim_layers import NORM_MODULES
    norm = getattr(src.args, "norm", None)
    if norm in NORM_MODULES:
        refusals.add(option_error("--norm", norm, f"a norm registered outside the plugin "
                                  f"({NORM_MODULES[norm].__module__}.{NORM_MODULES[norm].__name__}), "
                                  "which no layout of the export computes",
                                  "--norm layernorm|rmsnorm"))
    for spec_cls in vocabulary.specs():
        if known(spec_cls):
            continue
        for described in spec_cls.options():
            value = getattr(src.args, described.dest, None)
            if value is not None and value != described.default:
                refusals.add(option_error(
                    described.flag, _shown(value), f"a technique registered outside the plugin "
                    f"({spec_cls.__module__}.{spec_cls.__name__}), which no layout of the "
                    "export declares it computes", f"no {described.flag}"
                    if described.kind is bool else f"{described.flag} {described.default}"))


def check_no_class(src, refusals=None, computed=()):
    """Refuse every option of ``src`` that no class holds, in one line; ``computed``: the
    options of :data:`NO_CLASS` that the chosen custom-code layout computes."""
    own = refusals is None
    refusals = Refusals() if own else refusals
    args = src.args
    for name, on, flag, problem, allowed in NO_CLASS:
        if name in computed:
            continue
        value = getattr(args, name, None)
        if value is not None and on(value):
            refusals.add(option_error(flag, _shown(value), problem, allowed))
    if getattr(args, "sandwich", False) and "sandwich" not in computed:
        sides = ("decoder",) if src.lm else ("encoder", "decoder")
        for side in sides:
            width = getattr(args, f"{side}_embed_dim")
            heads = getattr(args, f"{side}_attention_heads")
            ffn = getattr(args, f"{side}_ffn_embed_dim")
            middle_dim, middle_heads = SandwichOptions.from_args(args).middle(width)
            middle_ffn = args.sandwich_ffn_dim or ffn
            for flag, value, own_value in (("--sandwich-dim", middle_dim, width),
                                           ("--sandwich-ffn-dim", middle_ffn, ffn),
                                           ("--sandwich-heads", middle_heads, heads)):
                if value != own_value:
                    refusals.add(option_error(
                        flag, getattr(args, flag[2:].replace("-", "_")) or value,
                        f"a sandwich middle of another shape than the {side}'s layers "
                        f"({value} where they have {own_value}) fits no class, whose layers "
                        "are all alike", f"--sandwich-dim 0 --sandwich-ffn-dim 0 "
                        f"--sandwich-heads {heads} (the middle at the model's shape, "
                        "its layers copied)"))
                    break  # one line for the side: its advice is the whole middle
    if own:
        refusals.raise_all()


def choose(src):
    """The layout module (:mod:`.llama`, :mod:`.xglm`, :mod:`.opt`, :mod:`.fsmt`,
    :mod:`.m2m100`, or the custom code of :mod:`.skipless`, :mod:`.anthe`, :mod:`.seq2seq`)
    that holds ``src``, or one line refusing every option in the way. A model that no stock
    class holds goes to the custom code where that computes it."""
    from slim_fairseq.export_hf import anthe, seq2seq, skipless
    refusals = Refusals()
    layout = _choose(src, refusals)
    if refusals.found and layout not in (skipless, anthe, seq2seq):
        custom, in_the_way = _custom_code_for(src)
        if not in_the_way.found:
            return custom
        if len(in_the_way.found) < len(refusals.found):
            refusals = in_the_way  # the shorter way to a model that exports
    refusals.raise_all()
    return layout


def _custom_code_for(src):
    """``(custom code, its refusals)`` for a model that no stock class holds: :mod:`.anthe` for
    a language model, :mod:`.seq2seq` for a translation model, which computes it when it
    refuses nothing."""
    from slim_fairseq.export_hf import anthe, seq2seq
    custom = anthe if src.lm else seq2seq
    refusals = Refusals()
    check_known_techniques(src, refusals)
    _check_custom(src, custom, refusals)
    return custom, refusals


def _check_custom(src, custom, refusals):
    """Into ``refusals``: what no stock class holds that the ``custom`` code does not compute
    either, and what its own allow-list refuses."""
    check_no_class(src, refusals, computed=custom.COMPUTES)
    refusals.each(custom.check, src)


def _choose(src, refusals):
    from slim_fairseq.export_hf import anthe, fsmt, llama, m2m100, opt, seq2seq, skipless, xglm
    check_known_techniques(src, refusals)
    for custom in (skipless, anthe, seq2seq):  # custom code: each with its own allow-list
        if custom.applies(src):
            _check_custom(src, custom, refusals)
            return custom
    check_no_class(src, refusals)
    refusals.each(lambda src: normformer_scales(
        src.model.decoder, "NormFormer's scales are in no class here"), src)
    args = src.args
    if src.lm:
        if args.norm == "rmsnorm" or float(args.rope_theta or 0) or args.ffn_glu:
            refusals.each(llama.check, src)
            return llama
        refusals.run(_no_grouped_heads, src, "a LayerNorm language model (XGLM, OPT)",
                     "decoder")
        if refusals.run(xglm.fits, src):
            return xglm
        refusals.each(opt.check, src)
        return opt
    refusals.run(_no_grouped_heads, src, "a sequence-to-sequence model (FSMT, M2M100)",
                 "encoder", "decoder")
    if bool(args.encoder_normalize_before) != bool(args.decoder_normalize_before):
        refusals.add(option_error(
            "--decoder-normalize-before" if args.decoder_normalize_before else
            "--encoder-normalize-before", None, "the encoder and the decoder normalise "
            "at different places, and FSMT and M2M100 have one rule for both",
            "both pre-norm (--encoder-normalize-before --decoder-normalize-before) or "
            "both post-norm"))
        return None
    if args.decoder_normalize_before:
        refusals.each(m2m100.check, src)
        return m2m100
    refusals.each(fsmt.check, src)
    return fsmt


def _no_grouped_heads(src, what, *sides):
    from slim_fairseq.export_hf.layers import attention_shape
    for side in sides:
        layer = getattr(src.model, side).layers[0]
        heads, kv_heads, head_dim = attention_shape(layer.self_attn)
        if kv_heads != heads:
            raise option_error("--kv-heads", src.args.kv_heads, f"{what} has as many key/value heads "
                         "as query heads", "--kv-heads 0")
        if heads * head_dim != getattr(src.args, f"{side}_embed_dim"):
            raise option_error("--head-dim", src.args.head_dim or head_dim, f"{what} has heads of "
                         "width / heads channels", "--head-dim 0")
