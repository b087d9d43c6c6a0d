"""Skipless decoder-only language model ``skipless_lm`` (docs/TECHNIQUES.md#skipless-transformers; issue 6).

Every block has no residual connection and no normalisation (one optional LayerNorm after the
embedding); it trains thanks to shaped attention (He & Hofmann), which starts as the identity.

Layouts (row-vector notation of docs/TECHNIQUES.md#weight-removal, ``s`` = ``--mlp-branch-scale``):

* serial:   ``y = s * FFN(Attn(x))``        (Attn includes its output projection P)
* parallel: ``y = (Attn(x) + s * FFN(x)) / sqrt(1 + s^2)``

Reduced form (``--removed-weights q|k|v``, Graef, arXiv:2404.12362): the attention has no W_Q (or W_K, W_V)
-- that slot takes the block input, which the embedding / previous block already multiplied by
the removed matrix -- and no output projection P (serial: P is merged into the FFN input
linears; parallel: a model trained directly in the reduced form). ``--keep-attn-out-proj``
keeps P, which is what exact conversion of a trained parallel model produces.
``slim_fairseq.weight_removal`` converts a trained model into its reduced form.
"""

import functools
import math

import torch
import torch.nn.functional as F
from fairseq.models import (
    FairseqIncrementalDecoder,
    FairseqLanguageModel,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import nn

from ..modules.shaped_attention import ShapedAttention
from ..option_errors import check_task, one_line_option_errors

DEFAULT_MAX_TARGET_POSITIONS = 1024
LAYOUTS = ("serial", "parallel")
FFN_TYPES = ("mlp", "glu")
FFN_ACTIVATIONS = ("relu", "gelu", "silu")
REMOVED_WEIGHTS = ("none", "q", "k", "v")

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def _check_choice(flag, value, allowed):
    if value not in allowed:
        raise ValueError(f"{flag}: got {value!r}, allowed {'|'.join(allowed)}")


def validate_skipless_args(args):
    """One-line ValueErrors for bad option values (raised at model build time)."""
    _check_choice("--skipless-layout", args.skipless_layout, LAYOUTS)
    _check_choice("--ffn-type", args.ffn_type, FFN_TYPES)
    _check_choice("--ffn-activation", args.ffn_activation, FFN_ACTIVATIONS)
    _check_choice("--removed-weights", args.removed_weights, REMOVED_WEIGHTS)
    heads, kv_heads = args.decoder_attention_heads, args.kv_heads or args.decoder_attention_heads
    if args.kv_heads < 0:
        raise ValueError(f"--kv-heads: must be >= 0 (0 = MHA), got {args.kv_heads}")
    if args.decoder_embed_dim % heads != 0:
        raise ValueError(
            f"--decoder-attention-heads: {heads} must divide --decoder-embed-dim {args.decoder_embed_dim}"
        )
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"--kv-heads: {kv_heads} must divide --decoder-attention-heads {heads} "
                         "(0 = MHA, 1 = MQA)")
    if args.removed_weights in ("k", "v") and kv_heads != heads:
        raise ValueError(
            f"--removed-weights {args.removed_weights}: needs MHA (W_K/W_V are d x {args.decoder_embed_dim * kv_heads // heads}, "
            f"not square, with --kv-heads {kv_heads}); allowed with MQA/GQA: none|q"
        )
    if args.keep_attn_out_proj and args.removed_weights == "none":
        raise ValueError("--keep-attn-out-proj: only meaningful with --removed-weights q|k|v")
    if args.rope_theta and (args.decoder_embed_dim // heads) % 2 != 0:
        raise ValueError(f"--rope-theta: RoPE needs an even head dim, got {args.decoder_embed_dim // heads}")


@functools.lru_cache(maxsize=None)
def activation_second_moment(name):
    """E[act(z)^2] for z ~ N(0, 1), by the trapezoid rule on [-12, 12] (deterministic; on the
    CPU even while a model is built on the meta device)."""
    z = torch.linspace(-12.0, 12.0, 24001, dtype=torch.float64, device="cpu")
    density = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return torch.trapezoid(ACTIVATIONS[name](z) ** 2 * density, z).item()


class SkiplessFeedForward(nn.Module):
    """ReLU/GELU MLP ``fc2(act(fc1 x))`` or GLU ``fc2(act(fc_gate x) * fc1 x)``.

    With no residual to carry the signal, the init keeps its second moment: N(0, 1/d) for the
    input linears and N(0, 1/(f * E[act(z)^2])) for the output linear.
    """

    def __init__(self, embed_dim, ffn_dim, ffn_type, activation, bias):
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        self.fc1 = nn.Linear(embed_dim, ffn_dim, bias=bias)
        self.fc_gate = nn.Linear(embed_dim, ffn_dim, bias=bias) if ffn_type == "glu" else None
        self.fc2 = nn.Linear(ffn_dim, embed_dim, bias=bias)
        out_std = math.sqrt(1.0 / (ffn_dim * activation_second_moment(activation)))
        for lin, std in ((self.fc1, embed_dim ** -0.5), (self.fc_gate, embed_dim ** -0.5),
                         (self.fc2, out_std)):
            if lin is not None:
                nn.init.normal_(lin.weight, std=std)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def forward(self, x):
        if self.fc_gate is None:
            return self.fc2(self.activation(self.fc1(x)))
        return self.fc2(self.activation(self.fc_gate(x)) * self.fc1(x))


class SkiplessBlock(nn.Module):
    """One skipless block (no residual, no norm): serial or parallel layout."""

    def __init__(self, args):
        super().__init__()
        removed = None if args.removed_weights == "none" else args.removed_weights
        self.parallel = args.skipless_layout == "parallel"
        self.mlp_branch_scale = float(args.mlp_branch_scale)
        # parallel sum of two unit-variance branches, rescaled to unit variance at init
        self.parallel_output_scale = 1.0 / math.sqrt(1.0 + self.mlp_branch_scale ** 2)
        self.self_attn = ShapedAttention(
            args.decoder_embed_dim,
            args.decoder_attention_heads,
            args.kv_heads or args.decoder_attention_heads,
            bias=args.linear_bias,
            rope_theta=args.rope_theta or None,
            dropout=args.attention_dropout,
            removed=removed,
            out_proj=removed is None or args.keep_attn_out_proj,
        )
        self.ffn = SkiplessFeedForward(
            args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.ffn_type, args.ffn_activation,
            args.linear_bias,
        )
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)

    def forward(self, x, padding_mask=None, incremental_state=None):
        if self.parallel:
            attn, _ = self.self_attn(x, padding_mask, incremental_state)
            ffn = self.ffn(x)
            mixed = self.dropout_module(attn) + self.mlp_branch_scale * self.dropout_module(ffn)
            return self.parallel_output_scale * mixed
        attn, _ = self.self_attn(x, padding_mask, incremental_state)
        attn = self.dropout_module(attn)
        return self.mlp_branch_scale * self.dropout_module(self.ffn(attn))


class SkiplessDecoder(FairseqIncrementalDecoder):
    """Token embedding (times sqrt(d) unless --no-scale-embedding), optional LayerNorm, skipless
    blocks, vocabulary projection (tied to the embedding or separate)."""

    def __init__(self, args, dictionary):
        super().__init__(dictionary)
        self.args = args
        embed_dim = args.decoder_embed_dim
        self.padding_idx = dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, padding_idx=self.padding_idx)
        # rows of unit norm: every token enters with RMS 1 after the sqrt(d) scale (without
        # residuals or norms, spread of token norms grows through the layers)
        nn.init.normal_(self.embed_tokens.weight)
        with torch.no_grad():
            self.embed_tokens.weight.div_(self.embed_tokens.weight.norm(dim=1, keepdim=True))
            self.embed_tokens.weight[self.padding_idx].zero_()
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(embed_dim)
        self.embed_layernorm = nn.LayerNorm(embed_dim) if args.embed_layernorm else None
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)
        self.layers = nn.ModuleList([SkiplessBlock(args) for _ in range(args.decoder_layers)])
        self.share_input_output_embed = args.share_decoder_input_output_embed
        if self.share_input_output_embed:
            self.output_projection = None
        else:
            self.output_projection = nn.Linear(embed_dim, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=embed_dim ** -0.5)

    def forward(self, prev_output_tokens, src_lengths=None, incremental_state=None,
                features_only=False, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, incremental_state=incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, incremental_state=None, **kwargs):
        tokens = prev_output_tokens
        if incremental_state is not None:
            tokens = tokens[:, -1:]
        padding_mask = tokens.eq(self.padding_idx)
        if not padding_mask.any():
            padding_mask = None
        x = self.embed_scale * self.embed_tokens(tokens)
        if self.embed_layernorm is not None:
            x = self.embed_layernorm(x)
        x = self.dropout_module(x)
        inner_states = [x]
        for layer in self.layers:
            x = layer(x, padding_mask, incremental_state)
            inner_states.append(x)
        return x, {"attn": [None], "inner_states": inner_states}

    def output_layer(self, features, **kwargs):
        if self.share_input_output_embed:
            return F.linear(features, self.embed_tokens.weight)
        return self.output_projection(features)

    def max_positions(self):
        return self.args.max_target_positions


@register_model("skipless_lm")
class SkiplessLanguageModel(FairseqLanguageModel):
    """Skipless LM (He & Hofmann, arXiv:2311.01906) with optional reduced form (Graef, arXiv:2404.12362)."""

    @staticmethod
    def add_args(parser):
        # no default= here: arch presets set defaults (fairseq parses with argument_default=SUPPRESS)
        parser.add_argument("--decoder-embed-dim", type=int, metavar="D", help="model width d")
        parser.add_argument("--decoder-layers", type=int, metavar="L", help="number of blocks")
        parser.add_argument("--decoder-attention-heads", type=int, metavar="H", help="query heads")
        parser.add_argument("--decoder-ffn-embed-dim", type=int, metavar="F", help="FFN hidden width")
        parser.add_argument("--kv-heads", type=int, metavar="N",
                            help="key/value heads: 0 = MHA (as many as the query heads), 1 = MQA, "
                            "a divisor of the query heads = GQA (default 0)")
        parser.add_argument("--skipless-layout", metavar="LAYOUT", help="serial (default) | parallel")
        parser.add_argument("--ffn-type", metavar="TYPE", help="mlp (default) | glu")
        parser.add_argument("--ffn-activation", metavar="ACT",
                            help="relu | gelu | silu; default relu for mlp, silu for glu (SwiGLU)")
        parser.add_argument("--linear-bias", action="store_true", help="biases on all projections")
        parser.add_argument("--rope-theta", type=float, metavar="THETA",
                            help="RoPE base on queries and keys; 0 = no positional encoding")
        parser.add_argument("--embed-layernorm", action="store_true",
                            help="one LayerNorm after the embedding (the only norm of the model)")
        parser.add_argument("--mlp-branch-scale", type=float, metavar="S",
                            help="constant factor on the FFN output (MLP branch down-weighting)")
        parser.add_argument("--removed-weights", metavar="W",
                            help="none (default) | q | k | v: reduced form without that matrix and P "
                                 "(Graef, arXiv:2404.12362); k and v need MHA")
        parser.add_argument("--keep-attn-out-proj", action="store_true",
                            help="reduced form keeping P (exact conversion of a parallel model)")
        parser.add_argument("--share-decoder-input-output-embed", action="store_true",
                            help="tie the input embedding and the vocabulary projection")
        parser.add_argument("--no-scale-embedding", action="store_true", help="do not scale embeddings by sqrt(d)")
        parser.add_argument("--dropout", type=float, metavar="P", help="dropout on block outputs")
        parser.add_argument("--attention-dropout", type=float, metavar="P", help="dropout on attention weights")
        parser.add_argument("--max-target-positions", type=int, metavar="N",
                            help="max positions (default: --tokens-per-sample)")

    @classmethod
    def check_args(cls, args, task=None):
        """Option checks that need no data (run right after parsing and again at build)."""
        validate_skipless_args(args)
        check_task(True, getattr(args, "arch", "skipless_lm"),
                   task if task is not None else getattr(args, "task", None))

    @classmethod
    def build_model(cls, args, task):
        skipless_lm_base_architecture(args)
        with one_line_option_errors():
            cls.check_args(args, task)
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        with one_line_option_errors():
            return cls(SkiplessDecoder(args, task.target_dictionary))

    @classmethod
    def contract_overrides(cls, arch):
        """CLI overrides that shrink any skipless arch to a tiny model (contract suite)."""
        overrides = ["--decoder-embed-dim", "32", "--decoder-layers", "2",
                     "--decoder-attention-heads", "4", "--decoder-ffn-embed-dim", "48"]
        if arch == "skipless_lm_mistral_7b":
            # a skipless SwiGLU stack squares the signal scale per block (degree-2 homogeneous):
            # down-weight the branch so the tiny model's log-probs stay O(log V) for fp32 checks
            overrides += ["--kv-heads", "2", "--mlp-branch-scale", "0.5"]
        return overrides


def skipless_lm_base_architecture(args):
    """Defaults of every skipless preset (only fills what is not set)."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 256)
    args.decoder_layers = getattr(args, "decoder_layers", 4)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 4 * args.decoder_embed_dim)
    args.kv_heads = getattr(args, "kv_heads", 0)
    args.skipless_layout = getattr(args, "skipless_layout", "serial")
    args.ffn_type = getattr(args, "ffn_type", "mlp")
    args.ffn_activation = getattr(args, "ffn_activation", "silu" if args.ffn_type == "glu" else "relu")
    args.linear_bias = getattr(args, "linear_bias", False)
    args.rope_theta = getattr(args, "rope_theta", 10000.0)
    args.embed_layernorm = getattr(args, "embed_layernorm", False)
    args.mlp_branch_scale = getattr(args, "mlp_branch_scale", 1.0)
    args.removed_weights = getattr(args, "removed_weights", "none")
    args.keep_attn_out_proj = getattr(args, "keep_attn_out_proj", False)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    args.no_scale_embedding = getattr(args, "no_scale_embedding", False)
    args.dropout = getattr(args, "dropout", 0.0)
    args.attention_dropout = getattr(args, "attention_dropout", 0.0)


@register_model_architecture("skipless_lm", "skipless_lm")
def skipless_lm(args):
    """Small CPU-trainable preset: d 256, 4 serial blocks, 4 heads (MHA), ReLU MLP 1024, RoPE,
    untied embeddings (tie them with --share-decoder-input-output-embed)."""
    skipless_lm_base_architecture(args)


@register_model_architecture("skipless_lm", "skipless_lm_parallel_noqp")
def skipless_lm_parallel_noqp(args):
    """Small parallel preset trained directly in the reduced form (no W_Q, no P; docs/TECHNIQUES.md#weight-removal)."""
    args.skipless_layout = getattr(args, "skipless_layout", "parallel")
    args.removed_weights = getattr(args, "removed_weights", "q")
    args.mlp_branch_scale = getattr(args, "mlp_branch_scale", 0.5)
    skipless_lm(args)


@register_model_architecture("skipless_lm", "skipless_lm_mistral_7b")
def skipless_lm_mistral_7b(args):
    """Mistral-7B shape: serial, d 4096, 32 layers, 32 heads, GQA 8 KV heads, SwiGLU 14336,
    untied embeddings (V 32000 comes from the dictionary), no biases, RoPE."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 4096)
    args.decoder_layers = getattr(args, "decoder_layers", 32)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 32)
    args.kv_heads = getattr(args, "kv_heads", 8)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 14336)
    args.ffn_type = getattr(args, "ffn_type", "glu")
    args.ffn_activation = getattr(args, "ffn_activation", "silu")
    args.skipless_layout = getattr(args, "skipless_layout", "serial")
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    skipless_lm_base_architecture(args)


@register_model_architecture("skipless_lm", "skipless_lm_pythia_6_9b")
def skipless_lm_pythia_6_9b(args):
    """Pythia-6.9B shape: parallel, d 4096, 32 layers, 32 heads (MHA), GELU MLP 16384, untied
    embeddings (V 50400 from the dictionary), RoPE."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 4096)
    args.decoder_layers = getattr(args, "decoder_layers", 32)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 32)
    args.kv_heads = getattr(args, "kv_heads", 0)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 16384)
    args.ffn_type = getattr(args, "ffn_type", "mlp")
    args.ffn_activation = getattr(args, "ffn_activation", "gelu")
    args.skipless_layout = getattr(args, "skipless_layout", "parallel")
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    skipless_lm_base_architecture(args)
