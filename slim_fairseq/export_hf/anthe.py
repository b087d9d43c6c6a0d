"""``SlimForCausalLM`` (transformers custom code, :mod:`.custom`) from a ``slim_lm`` (pre-norm
or post-norm, LayerNorm or RMSNorm, sinusoidal, learned or no positions, a LayerNorm on the
embedding) with Anthe's techniques (arXiv:2305.10991; docs/TECHNIQUES.md#anthe): gated
pre-attention, identity projections (``--no-patt``), H-SoftPOS, a GLU or dense MLP, a bias on
the output projection; or with the Subformer's (arXiv:2101.00234; docs/TECHNIQUES.md#subformer):
SAFE and its output, a sandwich middle of another width, FFN width or heads; or with fairseq's
adaptive input (written as the one table it computes) and adaptive softmax. Tensor Chains are
materialised first, as for every layout. The ``anthe_lm*`` and ``subformer_lm_*`` presets are
such models.

No stock class has these, so the model leaves as custom code whose maths is the plugin's own
files (``gate_function.py``, ``hsoftpos_function.py``, ``glu_function.py``, ``rope.py``,
``safe_function.py``, ``adaptive_softmax_function.py``, ``rmsnorm.py``); the stack is mapped
as a translation model's decoder is (:func:`.seq2seq._side`). :func:`check` is an allow-list:
whatever else the model has is refused by name.
"""
from slim_fairseq.export_hf.layers import (no_projections, normformer_scales, other_activation,
                                           same_parameter)
from slim_fairseq.export_hf.source import input_embedding
from slim_fairseq.option_errors import option_error

CLASS = "SlimForCausalLM"
AUTO = "AutoModelForCausalLM"
CUSTOM = True
# the options of the list of what no stock class holds that this layout computes
COMPUTES = ("self_attn_gate", "hsoftpos_levels", "output_bias", "no_patt", "safe_embed_dim",
            "sandwich", "adaptive_input", "adaptive_softmax_cutoff", "layernorm_embedding")
ACTIVATIONS = ("relu", "gelu", "silu")
WHAT = "the exported language model (custom code)"


def applies(src):
    """A language model with Anthe's gates, identity projections or H-SoftPOS, SAFE, a sandwich
    middle of another shape, an adaptive input or softmax (skipless blocks have their
    layout)."""
    from slim_fairseq.export_hf.seq2seq import _other_middle
    args = src.args
    return src.lm and (getattr(args, "self_attn_gate", "none") not in (None, "none")
                       or bool(getattr(args, "no_patt", False))
                       or bool(getattr(args, "hsoftpos_levels", 0))
                       or bool(getattr(args, "safe_embed_dim", 0))
                       or bool(getattr(args, "adaptive_input", False))
                       or bool(getattr(args, "adaptive_softmax_cutoff", None))
                       or _other_middle(src))


def _embedding(src):
    """``(kind, the embedding module)``: "hsoftpos", "safe" or "standard"."""
    from slim_fairseq.export_hf.seq2seq import _embedding
    return _embedding(src, "decoder")


def check(src):
    """A one-line refusal for each thing the exported Anthe model does not compute."""
    args, decoder = src.args, src.model.decoder
    kind, _ = _embedding(src)
    if decoder.layer_norm is None and args.decoder_normalize_before:  # (post-norm has none)
        yield option_error("--no-decoder-final-norm", None, f"{WHAT} normalises the last "
                           "layer's output", "the final norm (no --no-decoder-final-norm)")
    if (args.activation_fn or "relu") not in ACTIVATIONS:
        yield other_activation(args.activation_fn, WHAT, ACTIVATIONS)
    standard = input_embedding(src.model, "decoder")
    if kind == "standard" and standard is not None and standard.project_in:
        yield no_projections(WHAT)
    if decoder.project_out_dim is not None:
        yield no_projections(WHAT)
    yield from normformer_scales(decoder, f"{WHAT} has no NormFormer scales")


def _weight(module):
    """The weight of a bias-free linear map of fairseq's adaptive softmax (its ``TiedLinear``
    read as it multiplies), float32 and contiguous."""
    from fairseq.modules.adaptive_softmax import TiedLinear
    weight = module.weight.t() if isinstance(module, TiedLinear) and module.transpose else (
        module.weight)
    assert getattr(module, "bias", None) is None, module
    return weight.detach().float().contiguous().clone()


def _adaptive_softmax(reader, module, out):
    """fairseq's adaptive softmax into ``out`` (every parameter read): the head's words and
    cluster entries as one matrix, each cluster's projection and table; its config values."""
    import torch
    from torch import nn
    from fairseq.modules.adaptive_softmax import TiedHeadModule
    for name in list(reader.params):
        if name.startswith("decoder.adaptive_softmax."):
            reader.take(name)
    head = module.head
    if isinstance(head, TiedHeadModule):  # the first band's table (after a projection)
        words = list(head.word_proj) if isinstance(head.word_proj, nn.Sequential) else [
            head.word_proj]
        word_weight = _weight(words[0])
        for later in words[1:]:
            word_weight = _weight(later) @ word_weight
        out["lm_head.weight"] = torch.cat([word_weight, _weight(head.class_proj)])
    else:
        out["lm_head.weight"] = _weight(head)
    tails = []
    for i, tail in enumerate(module.tail):  # projection, dropout, table
        out[f"lm_tails.{i}.0.weight"] = _weight(tail[0])
        out[f"lm_tails.{i}.1.weight"] = _weight(tail[2])
        tails.append([out[f"lm_tails.{i}.0.weight"].size(0),
                      out[f"lm_tails.{i}.1.weight"].size(0)])
    return dict(head_words=int(module.cutoff[0]), tails=tails)


def build(src, reader):
    """``(config values, state dict)`` of the :class:`SlimForCausalLM` of ``src``."""
    from slim_fairseq.export_hf.seq2seq import _output, _side
    model, args = src.model, src.args
    decoder = model.decoder
    out = {}
    values = _side(src, reader, "decoder", out, dst="model")
    table_name = values.pop("table")
    safe_output, output_bias, adaptive = "none", False, None
    if getattr(decoder, "adaptive_softmax", None) is not None:
        adaptive = _adaptive_softmax(reader, decoder.adaptive_softmax, out)
    else:
        safe_output, output_bias = _output(src, reader, out)
    tied = safe_output == "none" and adaptive is None and same_parameter(
        model, table_name, "decoder.output_projection.weight")
    values.update(
        glu=bool(args.ffn_glu), hidden_act=args.activation_fn or "relu",
        rope_theta=float(args.rope_theta or 0),
        attention_gate=getattr(args, "self_attn_gate", None) or "none",
        removed_projection="qkv" if getattr(args, "no_patt", False) else None,
        output_bias=output_bias, safe_output=safe_output, adaptive_softmax=adaptive,
        tie_word_embeddings=tied, bos_token_id=src.dictionary.eos(),
        eos_token_id=src.dictionary.eos(), pad_token_id=src.dictionary.pad())
    return values, out
