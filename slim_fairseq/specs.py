"""What each block of a model is built from: frozen specs, made from the checked options.

The command line's options are described, checked and turned into the specs below by the
option specs of ``slim_fairseq/models/slim_options.py`` (one per technique); the modules
(``slim_fairseq/modules/``) take a spec as a constructor argument and never read fairseq's
config. docs/DESIGN.md ("From a flag to the code") maps every option to its spec field and the
module that uses it.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class ChainSpec:
    """A Tensor-Chain factorisation (Anthe, arXiv:2305.10991, Sec. 2.1): ``ratio`` 0 = dense;
    ``length`` cores; bonds at least ``min_bond`` (``--tc-min-bond``)."""

    ratio: float = 0.0
    length: int = 2
    min_bond: int = 0


DENSE = ChainSpec()


@dataclass(frozen=True)
class AttentionSpec:
    """One attention block's techniques: the gate (``--self-attn-gate``/``--cross-attn-gate``),
    ``--no-patt``, Tensor-Chain projections, grouped key/value heads, a head width other than
    width/heads, RoPE (self-attention), biases, and a skipless decoder's shaped attention with
    its removed projection. ``kv_heads`` 0 = as many as the query heads; ``head_dim`` 0 = the
    input width over the heads (both resolved: a value equal to the default is stored as 0).
    ``extensions``: the specs of the attention extensions on in this role (docs/DESIGN.md,
    "Adding a technique"), in the order they were registered."""

    gate: str = "none"
    no_patt: bool = False
    chain: ChainSpec = DENSE
    kv_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 0.0
    bias: bool = True
    shaped: bool = False
    removed: str = "none"
    out_proj: bool = True
    extensions: tuple = ()

    @property
    def plain(self):
        """Whether no technique is on, so that fairseq's own attention is built."""
        return self == PLAIN_ATTENTION


PLAIN_ATTENTION = AttentionSpec()


@dataclass(frozen=True)
class FeedForwardSpec:
    """The feed-forward: ``variant`` the spec of the variant whose options are on (the GLU's,
    ``--ffn-glu``, ``--glu-hidden``; None: fairseq's two linears), the activation, Tensor-Chain
    linears (``--tc-ff``/``--tc-layer``) and biases."""

    variant: object = None
    activation: str = "relu"
    chain: ChainSpec = DENSE
    bias: bool = True


@dataclass(frozen=True)
class NormSpec:
    """``--norm`` (layernorm, rmsnorm or none) with ``--rms-norm-eps``; ``export`` as fairseq's."""

    kind: str = "layernorm"
    eps: float = 1e-6
    export: bool = False


@dataclass(frozen=True)
class LayerSpec:
    """One encoder or decoder layer: its attentions, feed-forward and norms; a skipless block
    (``--skipless-layout``, He & Hofmann arXiv:2311.01906) with ``--mlp-branch-scale``;
    ``layout``: the spec of a block layout registered from outside whose options are on
    (docs/DESIGN.md, "Adding a technique"), or None. ``plugin_attention``: an attention with no
    technique on is the plugin's (:class:`~slim_fairseq.modules.attention.SlimMultiheadAttention`:
    fairseq's parameters, init and outputs in fewer launches) instead of fairseq's own class."""

    self_attn: AttentionSpec = AttentionSpec()
    cross_attn: AttentionSpec = AttentionSpec()
    ffn: FeedForwardSpec = FeedForwardSpec()
    norm: NormSpec = NormSpec()
    skipless: str = "none"
    mlp_branch_scale: float = 1.0
    layout: object = None
    plugin_attention: bool = False


@dataclass(frozen=True)
class EmbeddingSpec:
    """The input embedding of one side: the token table (a Tensor Chain with ``--tc-emb``),
    fairseq's scaled embedding plus positions, H-SoftPOS (``--hsoftpos-levels``,
    ``--hsoftpos-min-token-dim``) or SAFE (``--safe-embed-dim``), and the side it feeds;
    ``variant``: the spec of an input embedding registered from outside whose options are on
    (docs/DESIGN.md, "Adding a technique"), or None."""

    model_dim: int
    max_positions: int
    causal: bool
    learned_pos: bool = False
    normalize_before: bool = False
    scale: bool = True
    positions: bool = True
    table: ChainSpec = DENSE
    hsoftpos_levels: int = 0
    hsoftpos_min_token_dim: int = 0
    safe_dim: int = 0
    dropout: float = 0.0
    attention_dropout: float = 0.0
    variant: object = None


@dataclass(frozen=True)
class SAFEOutputSpec:
    """SAFE's output path d -> E (``--safe-output``): linear, or with the activation (mlp)."""

    mlp: bool = False
    activation: str = "relu"


@dataclass(frozen=True)
class SandwichSpec:
    """Sandwich sharing of one side (Subformer, arXiv:2101.00234, Sec. 2.2): ``layers`` in all,
    the middle ``layers - 2`` at width ``middle_dim`` (FFN ``middle_ffn``, ``middle_heads``
    heads) sharing one set of weights; ``cross_norm`` closes a wider middle's cross-attention."""

    layers: int
    model_dim: int
    middle_dim: int
    middle_ffn: int
    middle_heads: int
    cross_norm: str = "layernorm"
    export: bool = False

    @property
    def wider(self):
        return self.middle_dim != self.model_dim


@dataclass(frozen=True)
class TyingSpec:
    """STLM weight tying (arXiv:2405.14159, Sec. 3): FFN tying from offset ``ffn`` and
    attention-projection tying from ``attn_proj`` (None = off), LoRA of ``lora_rank`` scaled by
    ``lora_alpha`` on the tied FFN."""

    ffn: "int | None" = None
    attn_proj: "int | None" = None
    lora_rank: int = 0
    lora_alpha: float = 0.0

    @property
    def on(self):
        return self.ffn is not None or self.attn_proj is not None
