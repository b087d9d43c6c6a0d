"""``stlm_lm``: the STLM decoder-only LM family with cross-layer weight tying (Super Tiny Language
Models, arXiv:2405.14159; docs/TECHNIQUES.md#stlm-weight-tying).

Block (pre-norm, no biases anywhere)::

    h = x + Attn(RMSNorm(x))       # GQA, RoPE (theta 10000) on q and k
    y = h + SwiGLU(RMSNorm(h))     # w2(silu(w1 h) * w3 h)

then a final RMSNorm and the output projection, tied to the token table unless
``--untie-embeddings``. The vocabulary size is the dictionary's (GPT-2 BPE: 50257).
Default head width: ``2 * ((H // heads) // 2)`` (docs/TECHNIQUES.md#stlm-block; even, for RoPE).

Tying schemes (``slim_fairseq.modules.weight_tying``): ``--tie-ffn K``, ``--ffn-lora-rank R``,
``--ffn-lora-alpha A``, ``--tie-attn-proj K``. Presets: ``stlm_tied`` (the report's baseline)
and one per row of the table in docs/TECHNIQUES.md#stlm-presets-and-parameter-counts (:data:`STLM_PRESETS`).
"""

import argparse
import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import (
    FairseqIncrementalDecoder,
    FairseqLanguageModel,
    register_model,
    register_model_architecture,
)
from torch import Tensor, nn

from slim_fairseq.modules.gqa_attention import GroupedQueryAttention
from slim_fairseq.option_errors import check_task, one_line_option_errors
from slim_fairseq.modules.rmsnorm import RMSNorm
from slim_fairseq.modules.weight_tying import (
    add_tying_args,
    apply_weight_tying,
    set_tying_defaults,
    validate_tying,
)

DEFAULT_CONTEXT = 512


def stlm_head_dim(embed_dim: int, num_heads: int) -> int:
    """STLM block: ``2 * ((H // heads) // 2)`` (32 for H = 528 and 16 heads)."""
    return 2 * ((embed_dim // num_heads) // 2)


class SwiGLUFeedForward(nn.Module):
    """``w2(silu(w1 x) * w3 x)``; three bias-free linears (w1 gate, w3 up, w2 down)."""

    def __init__(self, embed_dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, embed_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class STLMBlock(nn.Module):
    """Pre-norm STLM transformer block; batch-first ``(B, T, C)``."""

    def __init__(self, args):
        super().__init__()
        dim = args.decoder_embed_dim
        self.attn_norm = RMSNorm(dim, eps=args.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(
            dim,
            args.decoder_attention_heads,
            args.kv_heads or args.decoder_attention_heads,
            head_dim=args.head_dim,
            bias=False,
            rope_theta=args.rope_theta if args.rope_theta > 0 else None,
            dropout=args.attention_dropout,
        )
        self.ffn_norm = RMSNorm(dim, eps=args.rms_norm_eps)
        self.ffn = SwiGLUFeedForward(dim, args.decoder_ffn_embed_dim)
        self.dropout = nn.Dropout(args.dropout)

    def forward(self, x, key_padding_mask=None, incremental_state=None):
        attn_out, _ = self.self_attn(
            self.attn_norm(x), key_padding_mask=key_padding_mask, incremental_state=incremental_state
        )
        x = x + self.dropout(attn_out)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class STLMDecoder(FairseqIncrementalDecoder):
    """Token table -> STLM blocks -> RMSNorm -> vocabulary projection."""

    def __init__(self, args, dictionary):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_target_positions = args.max_target_positions
        dim = args.decoder_embed_dim
        self.embed_tokens = nn.Embedding(len(dictionary), dim, padding_idx=self.padding_idx)
        self.dropout = nn.Dropout(args.dropout)
        self.layers = nn.ModuleList([STLMBlock(args) for _ in range(args.decoder_layers)])
        self.layer_norm = RMSNorm(dim, eps=args.rms_norm_eps)
        self.tie_embeddings = not args.untie_embeddings
        self.output_projection = (
            None if self.tie_embeddings else nn.Linear(dim, len(dictionary), bias=False)
        )
        self.reset_parameters(args.init_std)
        self.tying = apply_weight_tying(self.layers, args)

    def reset_parameters(self, std: float):
        """N(0, std) for tables and linears (residual outputs std / sqrt(2 D), as GPT-2)."""
        residual_std = std / math.sqrt(2 * len(self.layers))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        for layer in self.layers:
            nn.init.normal_(layer.self_attn.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(layer.ffn.w2.weight, mean=0.0, std=residual_std)
        with torch.no_grad():
            self.embed_tokens.weight[self.padding_idx].zero_()

    def _cached_length(self, incremental_state) -> int:
        state = self.layers[0].self_attn.get_incremental_state(incremental_state, "attn_state")
        if state is None or state.get("prev_key") is None:
            return 0
        return state["prev_key"].size(2)

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out=None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        **unused,
    ):
        tokens = prev_output_tokens
        if incremental_state is not None:
            past = self._cached_length(incremental_state)
            tokens = tokens[:, past:] if past < tokens.size(1) else tokens[:, -1:]
        padding_mask = tokens.eq(self.padding_idx)
        if incremental_state is None and not padding_mask.any():
            padding_mask = None
        x = self.dropout(self.embed_tokens(tokens))
        inner_states: List[Optional[Tensor]] = [x]
        for layer in self.layers:
            x = layer(x, key_padding_mask=padding_mask, incremental_state=incremental_state)
            inner_states.append(x)
        x = self.layer_norm(x)
        return x, {"attn": [None], "inner_states": inner_states}

    def output_layer(self, features: Tensor, **unused) -> Tensor:
        if self.output_projection is None:
            return F.linear(features, self.embed_tokens.weight)
        return self.output_projection(features)

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out=None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        features_only: bool = False,
        src_lengths=None,
        **unused,
    ):
        x, extra = self.extract_features(prev_output_tokens, incremental_state=incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def max_positions(self):
        return self.max_target_positions


@register_model("stlm_lm")
class STLMLanguageModel(FairseqLanguageModel):
    """STLM decoder-only LM (arXiv:2405.14159); presets ``stlm_*``."""

    @staticmethod
    def add_args(parser):
        # no default= here: presets set them (fairseq parses with argument_default=SUPPRESS)
        parser.add_argument("--decoder-embed-dim", type=int, metavar="H", help="model width H")
        parser.add_argument("--decoder-ffn-embed-dim", type=int, metavar="F",
                            help="SwiGLU hidden width F")
        parser.add_argument("--decoder-layers", type=int, metavar="D", help="number of blocks D")
        parser.add_argument("--decoder-attention-heads", type=int, metavar="N",
                            help="query heads (default 16)")
        parser.add_argument("--kv-heads", type=int, metavar="N",
                            help="key/value heads: 0 = MHA (as many as the query heads), 1 = MQA, "
                            "a divisor of the query heads = GQA (default 4)")
        parser.add_argument("--head-dim", type=int, metavar="N",
                            help="channels per head; 0 = 2*((H//heads)//2) (default)")
        parser.add_argument("--rope-theta", type=float, metavar="T",
                            help="RoPE base on q and k (default 10000); 0 = no RoPE")
        parser.add_argument("--rms-norm-eps", type=float, metavar="E", help="RMSNorm eps (1e-6)")
        parser.add_argument("--untie-embeddings", action="store_true",
                            help="separate output projection instead of the token table "
                            "(input/output tying is on by default)")
        parser.add_argument("--dropout", type=float, metavar="P", help="residual dropout (0)")
        parser.add_argument("--attention-dropout", type=float, metavar="P",
                            help="dropout on attention probabilities (0)")
        parser.add_argument("--init-std", type=float, metavar="S",
                            help="std of the normal init of tables and linears (0.02)")
        parser.add_argument("--max-target-positions", type=int, metavar="N",
                            help="longest context (default: --tokens-per-sample, else 512)")
        add_tying_args(parser)

    @classmethod
    def check_args(cls, args, task=None):
        """Option checks that need no data (run right after parsing and again at build)."""
        validate_stlm_args(args)
        check_task(True, getattr(args, "arch", "stlm_tied"),
                   task if task is not None else getattr(args, "task", None))

    @classmethod
    def build_model(cls, args, task):
        stlm_base(args)
        with one_line_option_errors():
            cls.check_args(args, task)
            return cls(STLMDecoder(args, task.target_dictionary))

    @classmethod
    def contract_overrides(cls, arch: str) -> List[str]:
        """CLI overrides that shrink any ``stlm_*`` preset to a tiny model of the same kind."""
        preset = argparse.Namespace()
        ARCH_FUNCTIONS[arch](preset)
        tiny = [
            "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
            "--decoder-attention-heads", "4", "--kv-heads", "2", "--decoder-layers", "7",
        ]
        if preset.ffn_lora_rank:
            tiny += ["--ffn-lora-rank", "4"]
        return tiny


def validate_stlm_args(args):
    """One-line ValueErrors for impossible shapes and tying options (at build time)."""
    dim, heads = args.decoder_embed_dim, args.decoder_attention_heads
    for flag, value in (("--decoder-embed-dim", dim), ("--decoder-ffn-embed-dim",
                        args.decoder_ffn_embed_dim), ("--decoder-layers", args.decoder_layers),
                        ("--decoder-attention-heads", heads)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if args.kv_heads < 0:
        raise ValueError(f"--kv-heads: must be >= 0 (0 = MHA), got {args.kv_heads}")
    kv = args.kv_heads or heads
    if dim % heads != 0:
        raise ValueError(
            f"--decoder-attention-heads: {heads} heads must divide --decoder-embed-dim {dim}"
        )
    if heads % kv != 0:
        raise ValueError(f"--kv-heads: {kv} must divide --decoder-attention-heads {heads} "
                         "(0 = MHA, 1 = MQA)")
    if args.head_dim == 0:
        args.head_dim = stlm_head_dim(dim, heads)
    if args.head_dim < 1 or (args.rope_theta > 0 and args.head_dim % 2 != 0):
        raise ValueError(f"--head-dim: must be an even integer >= 2 with RoPE, got {args.head_dim}")
    validate_tying(args, args.decoder_layers)


def _set(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


@register_model_architecture("stlm_lm", "stlm_tied")
def stlm_base(args):
    """Report baseline: D 8, H 528, F 1361, 16 q heads / 4 kv heads, tied in/out, no sharing."""
    _set(args, "decoder_embed_dim", 528)
    _set(args, "decoder_ffn_embed_dim", 1361)
    _set(args, "decoder_layers", 8)
    _set(args, "decoder_attention_heads", 16)
    _set(args, "kv_heads", 4)
    _set(args, "head_dim", 0)
    _set(args, "rope_theta", 10000.0)
    _set(args, "rms_norm_eps", 1e-6)
    _set(args, "untie_embeddings", False)
    _set(args, "dropout", 0.0)
    _set(args, "attention_dropout", 0.0)
    _set(args, "init_std", 0.02)
    _set(args, "max_target_positions", getattr(args, "tokens_per_sample", None) or DEFAULT_CONTEXT)
    set_tying_defaults(args)


# name: (D, H, F, ffn tie k, LoRA rank, attention-projection tie k, untied) -- docs/TECHNIQUES.md STLM table
STLM_PRESETS = {
    "stlm_untied": (8, 528, 1361, None, 0, None, True),
    "stlm_ffn_all_wide": (8, 672, 1733, 0, 0, None, False),
    "stlm_ffn_k1_wide": (8, 608, 1568, 1, 0, None, False),
    "stlm_ffn_k2_wide": (8, 560, 1444, 2, 0, None, False),
    "stlm_ffn_all_long": (14, 608, 1568, 0, 0, None, False),
    "stlm_ffn_lora_all_deep": (12, 592, 1527, 0, 64, None, False),
    "stlm_ffn_lora_all_wide": (8, 640, 1650, 0, 64, None, False),
    "stlm_ffn_lora_k1_wide": (8, 592, 1527, 1, 64, None, False),
    "stlm_ffn_lora_k2_deep": (12, 512, 1440, 2, 64, None, False),
    "stlm_attn_proj_long": (10, 512, 1320, None, 0, 0, False),
}

ARCH_FUNCTIONS = {"stlm_tied": stlm_base}


def _make_preset(name, layers, width, ffn, ffn_k, rank, proj_k, untied):
    def preset(args):
        _set(args, "decoder_layers", layers)
        _set(args, "decoder_embed_dim", width)
        _set(args, "decoder_ffn_embed_dim", ffn)
        _set(args, "tie_ffn", "none" if ffn_k is None else ffn_k)
        _set(args, "ffn_lora_rank", rank)
        _set(args, "tie_attn_proj", "none" if proj_k is None else proj_k)
        _set(args, "untie_embeddings", untied)
        stlm_base(args)

    preset.__name__ = name
    preset.__doc__ = (
        f"STLM table row: D {layers}, H {width}, F {ffn}, FFN tie k={ffn_k}, LoRA r={rank}, "
        f"attention-projection tie k={proj_k}, {'untied' if untied else 'tied'} in/out."
    )
    return register_model_architecture("stlm_lm", name)(preset)


for _name, _row in STLM_PRESETS.items():
    ARCH_FUNCTIONS[_name] = _make_preset(_name, *_row)
