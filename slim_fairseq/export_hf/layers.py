"""What the layouts share: the shape of an attention block, and the copy of a fairseq layer
into the classes that keep fairseq's own names inside a layer (XGLM, OPT, FSMT, M2M100:
``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``encoder_attn``, ``fc1``, ``fc2``,
``final_layer_norm``)."""
import torch

from slim_fairseq.option_errors import option_error

# transformers' LayerNorm in these classes: torch's default eps
LAYER_NORM_EPS = 1e-5


def no_projections(what):
    """The refusal of projections between the embedding and the layers, which ``what`` (a
    layout's model) has not."""
    return option_error("--decoder-input-dim/--decoder-output-dim", None, f"{what} has no "
                        "projections between the embedding and the layers",
                        "both equal to --decoder-embed-dim")


# NormFormer's scales: fairseq's flag and the module of a decoder layer that has it
NORMFORMER = (("--scale-attn", "attn_ln"), ("--scale-heads", "c_attn"),
              ("--scale-fc", "ffn_layernorm"), ("--scale-resids", "w_resid"))


def normformer_scales(decoder, problem):
    """A refusal, saying ``problem``, for each of NormFormer's scales that ``decoder``'s layers
    have."""
    for flag, name in NORMFORMER:
        if getattr(decoder.layers[0], name, None) is not None:
            yield option_error(flag, None, problem, f"no {flag}")


def other_activation(value, what, allowed):
    """The refusal of ``--activation-fn value``, which ``what`` computes with none of
    ``allowed``."""
    return option_error("--activation-fn", value, f"{what} takes {'|'.join(allowed)}",
                        f"--activation-fn {'|'.join(allowed)}")


def attention_shape(attention):
    """``(heads, key/value heads, head width)`` of fairseq's or the plugin's attention."""
    heads = attention.num_heads
    return heads, getattr(attention, "kv_heads", heads), attention.head_dim


def _linear(reader, src, dst, out):
    weight, bias = reader.linear(src)
    out[f"{dst}.weight"] = weight
    # a class with biases everywhere takes a bias-free layer (--no-linear-bias) as zero biases
    out[f"{dst}.bias"] = bias if bias is not None else torch.zeros(weight.size(0))


def _layer_norm(reader, src, dst, out):
    weight, bias, eps = reader.norm(src)
    if bias is None or abs(eps - LAYER_NORM_EPS) > 1e-12:
        raise option_error("--norm", "rmsnorm" if bias is None else "layernorm",
                           f"{src} is not a LayerNorm of eps {LAYER_NORM_EPS}, the norm of "
                           "these classes", "--norm layernorm")
    out[f"{dst}.weight"], out[f"{dst}.bias"] = weight, bias


def copy_layer(reader, src, dst, out, cross=False):
    """Copy fairseq layer ``src`` (a state-dict prefix) to ``dst`` in ``out``."""
    for attention in ("self_attn",) + (("encoder_attn",) if cross else ()):
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(reader, f"{src}.{attention}.{proj}", f"{dst}.{attention}.{proj}", out)
        _layer_norm(reader, f"{src}.{attention}_layer_norm", f"{dst}.{attention}_layer_norm", out)
    _linear(reader, f"{src}.fc1", f"{dst}.fc1", out)
    _linear(reader, f"{src}.fc2", f"{dst}.fc2", out)
    _layer_norm(reader, f"{src}.final_layer_norm", f"{dst}.final_layer_norm", out)


def copy_linear(reader, src, dst, out):
    """A linear layer into ``out`` as ``dst.weight`` (and ``dst.bias`` only if it has a bias);
    whether it has one."""
    weight, bias = reader.linear(src)
    out[f"{dst}.weight"] = weight
    if bias is not None:
        out[f"{dst}.bias"] = bias
    return bias is not None


def copy_attention(reader, src, dst, module, out, bias):
    """An attention's projections into the custom code's ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj`` (an identity projection, ``--no-patt``, or a removed one has none); whether they
    have biases into ``bias["attention"]``."""
    for name, target in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                         ("out_proj", "o_proj")):
        if getattr(module, name, None) is not None:
            bias["attention"] = copy_linear(reader, f"{src}.{name}", f"{dst}.{target}", out)


def copy_mlp(reader, src_layer, dst_layer, glu, out):
    """A block's MLP (``fc1``, ``fc2``; a GLU's ``fc1.w1``, ``fc1.w3``) into the custom code's
    ``mlp`` of ``dst_layer``; whether its linears have biases."""
    names = (("fc1.w1", "w1"), ("fc1.w3", "w3"), ("fc2", "fc2")) if glu else (
        ("fc1", "fc1"), ("fc2", "fc2"))
    for name, target in names:
        has_bias = copy_linear(reader, f"{src_layer}.{name}", f"{dst_layer}.mlp.{target}", out)
    return has_bias


def copy_norm(reader, src, dst, out):
    _layer_norm(reader, src, dst, out)


def same_parameter(model, a, b):
    """Whether state-dict names ``a`` and ``b`` of ``model`` are one parameter (tied)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return a in params and b in params and params[a] is params[b]
