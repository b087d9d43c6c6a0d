"""A slim_fairseq model as transformers custom code (``trust_remote_code=True``).

Only the composition is written here: token embedding, blocks, output projection, and the
transformers cache. Each technique's maths is the plugin's own module file, copied unchanged
beside this one by the export (``rope.py``: RoPE; ``shaped_attention.py``: shaped attention;
``skipless_block.py``: the skipless block's output from its branches; ``glu_function.py``: the
GLU), the very files the fairseq model runs.
"""
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_slim import SlimConfig
from .glu_function import glu
from .rope import RotaryEmbedding
from .shaped_attention import shaped_mixing
from .skipless_block import skipless_output

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}
# the name of the cache in transformers' outputs and arguments (``past_key_values`` before 5.x)
CACHE = ("cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
         else "past_key_values")


class SlimAttention(nn.Module):
    """Projections (one of q, k, v may be the input itself), grouped key/value heads, RoPE,
    the cache, then the shaped mixing of its plugin file and the output projection P (if
    kept)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim ** -0.5
        width, bias = config.hidden_size, config.attention_bias
        out = {"q": self.heads * self.head_dim, "k": self.kv_heads * self.head_dim,
               "v": self.kv_heads * self.head_dim}
        for name in ("q", "k", "v"):
            proj = (None if name == config.removed_projection
                    else nn.Linear(width, out[name], bias=bias))
            setattr(self, f"{name}_proj", proj)
        self.o_proj = (nn.Linear(out["q"], width, bias=bias) if config.attention_out_proj
                       else None)
        self.rope = RotaryEmbedding(self.head_dim, config.rope_theta)
        self.alpha = nn.Parameter(torch.ones(self.heads))
        self.beta = nn.Parameter(torch.ones(self.heads))
        self.gamma = nn.Parameter(torch.ones(self.heads))

    def _split(self, x, heads):
        bsz, length, _ = x.shape
        return x.view(bsz, length, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, key_padding_mask, cache):
        q, k, v = (x if proj is None else proj(x) for proj in (self.q_proj, self.k_proj,
                                                              self.v_proj))
        q, k, v = self._split(q, self.heads), self._split(k, self.kv_heads), self._split(
            v, self.kv_heads)
        past = 0 if cache is None else cache.get_seq_length(self.layer_idx)
        rows = self.rope.rows(q, past)
        q, k = self.rope.rotate(q, *rows), self.rope.rotate(k, *rows)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        q_len, k_len = q.size(2), k.size(2)
        causal = key_padding_mask is None and past == 0
        future = None
        if not causal and q_len > 1:  # -inf where a key lies after the query's position
            future = torch.full((q_len, k_len), float("-inf"), dtype=q.dtype,
                                device=q.device).triu(past + 1)
        out = shaped_mixing(q, k, v, self.alpha, self.beta, self.gamma, future,
                            key_padding_mask, 0.0, self.scaling, causal=causal)
        out = out.transpose(1, 2).reshape(x.size(0), q_len, self.heads * self.head_dim)
        return out if self.o_proj is None else self.o_proj(out)


class SlimMLP(nn.Module):
    """``fc2(act(fc1 x))``, or with ``config.glu`` the GLU of its plugin file:
    ``fc2(act(w1 x) * w3 x)``."""

    def __init__(self, config):
        super().__init__()
        width, hidden, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.glu = config.glu
        if self.glu:
            self.w1 = nn.Linear(width, hidden, bias=bias)
            self.w3 = nn.Linear(width, hidden, bias=bias)
        else:
            self.fc1 = nn.Linear(width, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, width, bias=bias)
        self.activation = config.hidden_act

    def forward(self, x):
        if self.glu:
            return self.fc2(glu(x, self.w1, self.w3, self.activation))
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


class SlimBlock(nn.Module):
    """A skipless block: attention and MLP joined by its plugin file."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = SlimAttention(config, layer_idx)
        self.mlp = SlimMLP(config)
        self.parallel = config.skipless_layout == "parallel"
        self.mlp_branch_scale = config.mlp_branch_scale

    def forward(self, x, key_padding_mask, cache):
        attn = self.self_attn(x, key_padding_mask, cache)
        return skipless_output(x, attn, self.mlp, self.parallel, self.mlp_branch_scale)


class SlimPreTrainedModel(PreTrainedModel):
    config_class = SlimConfig
    config: SlimConfig
    base_model_prefix = "model"
    _no_split_modules = ["SlimBlock"]

    def _init_weights(self, module):
        """The weights come from the fairseq checkpoint; a fresh model gets torch's defaults."""


class SlimModel(SlimPreTrainedModel):
    """Token embedding (times ``embed_scale``) and the blocks."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         config.pad_token_id)
        self.layers = nn.ModuleList(SlimBlock(config, i) for i in range(config.num_hidden_layers))
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids, attention_mask=None, cache=None):
        x = self.config.embed_scale * self.embed_tokens(input_ids)
        key_padding_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            key_padding_mask = attention_mask.eq(0)  # (B, cached + new): True at padding
        for layer in self.layers:
            x = layer(x, key_padding_mask, cache)
        return x


class SlimForCausalLM(SlimPreTrainedModel, GenerationMixin):
    """The language model: :class:`SlimModel` and the output projection (with its bias when
    the fairseq model has one)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.model = SlimModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.output_bias)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, labels=None,
                cache=None, past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", True)
        if use_cache and cache is None:
            try:
                cache = DynamicCache(config=self.config)
            except TypeError:  # transformers before 4.56
                cache = DynamicCache()
        if not use_cache:
            cache = None
        hidden = self.model(input_ids, attention_mask=attention_mask, cache=cache)
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache})
