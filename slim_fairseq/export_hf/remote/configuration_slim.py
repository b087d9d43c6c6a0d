"""The configuration of a slim_fairseq model exported as transformers custom code
(``trust_remote_code=True``): the shape of the model and which of the plugin's techniques its
blocks compute."""
from transformers import PretrainedConfig


class SlimConfig(PretrainedConfig):
    """``block``: "skipless" (shaped attention, no residual, no norm; ``skipless_layout``
    serial or parallel, ``mlp_branch_scale``, ``removed_projection`` the attention input
    without a projection, ``attention_out_proj`` whether P is kept); ``glu``: the MLP is a GLU
    (``hidden_act`` its gate's activation). ``block`` "pre-norm": fairseq's pre-norm block
    (residuals, a final norm), "post-norm" fairseq's post-norm block, with Anthe's
    ``attention_gate``; their norms are ``norm`` "layernorm" (of ``norm_eps``, also the eps of
    SAFE's and a sandwich's LayerNorms) or "rmsnorm" (of ``rms_norm_eps``); ``rope_theta`` 0: no
    RoPE. ``positions`` "sinusoidal" or "learned": fairseq's table (``position_rows`` rows: its
    sinusoids written by the export, or its learned table) added to the scaled tokens;
    ``layernorm_embedding``: a LayerNorm (of ``norm_eps``) on the embedding's output;
    ``hsoftpos_levels`` > 0: H-SoftPOS on a token table ``hsoftpos_token_dim`` wide with slots
    ``hsoftpos_slots`` wide.

    A translation model (``is_encoder_decoder``): the values above are its decoder's, the
    decoder layers attend to the encoder with ``cross_attention_gate``; ``encoder`` holds the
    values of the encoder that differ from them (its vocabulary, width, block...).
    ``removed_projection`` may name several inputs ("qkv": Anthe's identity projections).
    ``safe``: the shape of SAFE's attention on a token table ``safe["hidden_size"]`` wide (None:
    no SAFE), ``safe_output`` "linear" or "mlp": the decoder's output through it. ``sandwich``:
    the values of the middle layers (None: all layers alike); ``projected``: they have another
    width than the model, reached by up and down projections, and attend to the encoder through
    projections at the model's width (``cross_norm``: closed by a LayerNorm).
    ``adaptive_softmax``: a language model's output as fairseq's adaptive softmax (None: one
    projection): ``head_words`` words in the head, ``tails`` the (width, words) of each
    cluster."""

    model_type = "slim_fairseq"

    def __init__(self, vocab_size=32000, hidden_size=256, intermediate_size=1024,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=None,
                 head_dim=None, hidden_act="relu", glu=False, max_position_embeddings=1024,
                 rope_theta=10000.0, block="skipless", skipless_layout="serial",
                 mlp_branch_scale=1.0, removed_projection=None, attention_out_proj=True,
                 attention_bias=False, mlp_bias=False, embed_scale=1.0, output_bias=False,
                 attention_gate="none", norm_eps=1e-5, norm="layernorm", rms_norm_eps=1e-6,
                 positions="none", position_rows=0, layernorm_embedding=False,
                 hsoftpos_levels=0, hsoftpos_token_dim=0, hsoftpos_slots=0,
                 tie_word_embeddings=False, use_cache=True, pad_token_id=1, bos_token_id=2,
                 eos_token_id=2, cross_attention_gate="none", encoder=None, safe=None,
                 safe_output="none", sandwich=None, adaptive_softmax=None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.glu = glu
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.block = block
        self.skipless_layout = skipless_layout
        self.mlp_branch_scale = mlp_branch_scale
        self.removed_projection = removed_projection
        self.attention_out_proj = attention_out_proj
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.embed_scale = embed_scale
        self.output_bias = output_bias
        self.use_cache = use_cache
        self.attention_gate = attention_gate
        self.norm_eps = norm_eps
        self.norm = norm
        self.rms_norm_eps = rms_norm_eps
        self.positions = positions
        self.position_rows = position_rows
        self.layernorm_embedding = layernorm_embedding
        self.hsoftpos_levels = hsoftpos_levels
        self.hsoftpos_token_dim = hsoftpos_token_dim
        self.hsoftpos_slots = hsoftpos_slots
        self.cross_attention_gate = cross_attention_gate
        self.encoder = encoder
        self.safe = safe
        self.safe_output = safe_output
        self.sandwich = sandwich
        self.adaptive_softmax = adaptive_softmax
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         **kwargs)
