"""A slim_fairseq model as transformers custom code (``trust_remote_code=True``).

Only the composition is written here: token embedding, blocks, output projection, and the
transformers cache. Each technique's maths is the plugin's own module file, copied unchanged
beside this one by the export (``rope.py``: RoPE; ``shaped_attention.py``: shaped attention;
``skipless_block.py``: the skipless block's output from its branches; ``glu_function.py``: the
GLU; ``gate_function.py``: Anthe's gated pre-attention; ``hsoftpos_function.py``: H-SoftPOS;
``safe_function.py``: SAFE's embedding and output; ``adaptive_softmax_function.py``: the
log-probabilities of an adaptive softmax; ``rmsnorm.py``: RMSNorm),
the very files the fairseq model runs. A translation model
(:class:`SlimForConditionalGeneration`) composes the same blocks into an encoder and a decoder
whose layers attend to it.
"""
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast, Seq2SeqLMOutput

from .adaptive_softmax_function import adaptive_log_probs
from .configuration_slim import SlimConfig
from .gate_function import gated, gated_inputs
from .glu_function import glu
from .hsoftpos_function import KERNEL_SIZE, hsoftpos_levels, level_dilations
from .rmsnorm import RMSNorm
from .rope import RotaryEmbedding
from .safe_function import safe_embedding, safe_logits
from .shaped_attention import shaped_mixing
from .skipless_block import skipless_output

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}
# the name of the cache in transformers' outputs and arguments (``past_key_values`` before 5.x)
CACHE = ("cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
         else "past_key_values")


def padding_mask(attention_mask):
    """True at padding, from transformers' attention mask (None when nothing is padded)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.eq(0)


def block_norm(config, width):
    """The norm of the blocks and the final norm: ``config.norm`` "rmsnorm" (the plugin's file)
    or "layernorm"."""
    if config.norm == "rmsnorm":
        return RMSNorm(width, eps=config.rms_norm_eps)
    return nn.LayerNorm(width, eps=config.norm_eps)


class SideConfig:
    """``config`` with the values of one part of the model over it (a translation model's
    encoder: ``config.encoder``)."""

    def __init__(self, config, values):
        self._base, self._values = config, dict(values or {})

    def __getattr__(self, name):  # (only for names not set above)
        if name in ("_base", "_values"):  # (before __init__ set them: copy, pickle)
            raise AttributeError(f"{name}: not set yet; allowed: a SideConfig made by __init__")
        return self._values[name] if name in self._values else getattr(self._base, name)


class SlimCache(DynamicCache):
    """transformers' cache of keys and values, and H-SoftPOS's convolution inputs of earlier
    steps (``histories``), reordered with them in beam search."""

    def __init__(self, config=None):
        try:
            super().__init__(config=config)
        except TypeError:  # transformers before 4.56
            super().__init__()
        self.histories = {}

    def _each_history(self, change):
        for key, value in self.histories.items():
            self.histories[key] = change(value)

    def reorder_cache(self, beam_idx):
        super().reorder_cache(beam_idx)
        self._each_history(lambda value: value.index_select(0, beam_idx.to(value.device)))

    def batch_repeat_interleave(self, repeats):
        super().batch_repeat_interleave(repeats)
        self._each_history(lambda value: value.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices):
        super().batch_select_indices(indices)
        self._each_history(lambda value: value[indices])


class SlimAttention(nn.Module):
    """Projections (any of q, k, v may be the input itself; Anthe's gate between two of them),
    grouped key/value heads, RoPE, the cache, then softmax attention (or the shaped mixing of a
    skipless block) and the output projection (if kept). ``causal`` False: an encoder's
    self-attention; ``memory_width``: a cross-attention to an encoder output that wide."""

    def __init__(self, config, layer_idx, causal=True, memory_width=0):
        super().__init__()
        self.layer_idx = layer_idx
        self.cross = bool(memory_width)
        self.causal = causal and not self.cross
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim ** -0.5
        self.gate = config.cross_attention_gate if self.cross else config.attention_gate
        self.shaped = config.block == "skipless" and not self.cross
        width, bias = config.hidden_size, config.attention_bias
        inputs = {"q": width, "k": memory_width or width, "v": memory_width or width}
        out = {"q": self.heads * self.head_dim, "k": self.kv_heads * self.head_dim,
               "v": self.kv_heads * self.head_dim}
        for name in ("q", "k", "v"):
            proj = (None if name in (config.removed_projection or "")
                    else nn.Linear(inputs[name], out[name], bias=bias))
            setattr(self, f"{name}_proj", proj)
        self.o_proj = (nn.Linear(out["q"], width, bias=bias) if config.attention_out_proj
                       else None)
        self.rope = (RotaryEmbedding(self.head_dim, config.rope_theta)
                     if config.rope_theta and not self.cross else None)
        if self.shaped:
            self.alpha = nn.Parameter(torch.ones(self.heads))
            self.beta = nn.Parameter(torch.ones(self.heads))
            self.gamma = nn.Parameter(torch.ones(self.heads))

    def _project(self, name, x):
        proj = getattr(self, f"{name}_proj")
        return x if proj is None else proj(x)

    def _project_gated(self, name, x, gate):
        return gated(getattr(self, f"{name}_proj"), x, gate)

    def _split(self, x, heads):
        bsz, length, _ = x.shape
        return x.view(bsz, length, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, key_padding_mask, cache, memory=None):
        if self.cross:
            return self._attend_memory(x, memory, key_padding_mask, cache)
        q, k, v = gated_inputs(self.gate, x, x, x, self._project, self._project_gated)
        q, k, v = self._split(q, self.heads), self._split(k, self.kv_heads), self._split(
            v, self.kv_heads)
        past = 0 if cache is None else cache.get_seq_length(self.layer_idx)
        if self.rope is not None:
            rows = self.rope.rows(q, past)
            q, k = self.rope.rotate(q, *rows), self.rope.rotate(k, *rows)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        q_len, k_len = q.size(2), k.size(2)
        causal = self.causal and key_padding_mask is None and past == 0
        future = None
        if self.causal and not causal and q_len > 1:  # -inf where a key lies after the query
            future = torch.full((q_len, k_len), float("-inf"), dtype=q.dtype,
                                device=q.device).triu(past + 1)
        if self.shaped:
            out = shaped_mixing(q, k, v, self.alpha, self.beta, self.gamma, future,
                                key_padding_mask, 0.0, self.scaling, causal=causal)
        else:
            mask = future
            if key_padding_mask is not None:
                pads = key_padding_mask.view(x.size(0), 1, 1, k_len)
                mask = ~pads if future is None else torch.where(pads, float("-inf"), future)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal and q_len > 1, scale=self.scaling,
                enable_gqa=self.kv_heads != self.heads)
        return self._output(out, x.size(0), q_len)

    def _output(self, out, bsz, q_len):
        out = out.transpose(1, 2).reshape(bsz, q_len, self.heads * self.head_dim)
        return out if self.o_proj is None else self.o_proj(out)

    def _attend_memory(self, x, memory, memory_mask, cache):
        """Cross-attention to the encoder output ``memory``: its keys and values (gated among
        themselves) are computed once per sentence and kept in ``cache`` (transformers'
        :class:`EncoderDecoderCache`, its cross-attention part)."""
        if cache is not None and cache.is_updated.get(self.layer_idx, False):
            q, _, _ = gated_inputs(self.gate, x, None, None, self._project, self._project_gated)
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            k, v = layer.keys, layer.values
        else:
            q, k, v = gated_inputs(self.gate, x, memory, memory, self._project,
                                   self._project_gated)
            k, v = self._split(k, self.kv_heads), self._split(v, self.kv_heads)
            if cache is not None:
                k, v = cache.cross_attention_cache.update(k, v, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
        q = self._split(q, self.heads)
        mask = None if memory_mask is None else ~memory_mask.view(x.size(0), 1, 1, k.size(2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                             enable_gqa=self.kv_heads != self.heads)
        return self._output(out, x.size(0), q.size(2))


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
    """A skipless block (attention and MLP joined by its plugin file), or fairseq's pre-norm
    block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``, or its post-norm block:
    ``LN(x + Attn(x))``, then ``LN(x + MLP(x))``; a translation decoder's layers attend to the
    encoder between the two (``memory_width``: the encoder's width)."""

    def __init__(self, config, layer_idx, causal=True, memory_width=0, model_config=None):
        super().__init__()
        self.self_attn = SlimAttention(config, layer_idx, causal=causal)
        self.mlp = SlimMLP(config)
        self.skipless = config.block == "skipless"
        self.encoder_attn = None
        if self.skipless:
            self.parallel = config.skipless_layout == "parallel"
            self.mlp_branch_scale = config.mlp_branch_scale
        else:
            self.post_norm = config.block == "post-norm"
            self.self_attn_layer_norm = block_norm(config, config.hidden_size)
            if memory_width and model_config is not None:  # a sandwich middle of another width
                self.encoder_attn = SlimProjectedAttention(model_config, config, layer_idx,
                                                           memory_width)
            elif memory_width:
                self.encoder_attn = SlimAttention(config, layer_idx, memory_width=memory_width)
            if memory_width:
                self.encoder_attn_layer_norm = block_norm(config, config.hidden_size)
            self.final_layer_norm = block_norm(config, config.hidden_size)

    def _residual(self, x, norm, branch, *args):
        if self.post_norm:
            return norm(x + branch(x, *args))
        return x + branch(norm(x), *args)

    def forward(self, x, key_padding_mask, cache, memory=None, memory_mask=None,
                cross_cache=None):
        if self.skipless:
            attn = self.self_attn(x, key_padding_mask, cache)
            return skipless_output(x, attn, self.mlp, self.parallel, self.mlp_branch_scale)
        x = self._residual(x, self.self_attn_layer_norm, self.self_attn, key_padding_mask, cache)
        if self.encoder_attn is not None:
            x = self._residual(x, self.encoder_attn_layer_norm, self.encoder_attn, memory_mask,
                               cross_cache, memory)
        return self._residual(x, self.final_layer_norm, self.mlp)


class SlimProjection(nn.Module):
    """A change of width between a sandwich's parts: ``LN(W x + b)``."""

    def __init__(self, width, out_width, eps):
        super().__init__()
        self.linear = nn.Linear(width, out_width)
        self.layer_norm = nn.LayerNorm(out_width, eps=eps)

    def forward(self, x):
        return self.layer_norm(self.linear(x))


class SlimProjectedAttention(nn.Module):
    """The cross-attention of a sandwich middle of another width than the model
    (``middle``): projected to the model's width (``model``), attending there, projected
    back (closed by a LayerNorm unless ``cross_norm`` is off)."""

    def __init__(self, model, middle, layer_idx, memory_width):
        super().__init__()
        self.to_model = SlimProjection(middle.hidden_size, model.hidden_size, model.norm_eps)
        self.attention = SlimAttention(model, layer_idx, memory_width=memory_width)
        self.to_middle = nn.Linear(model.hidden_size, middle.hidden_size)
        self.to_middle_norm = (nn.LayerNorm(middle.hidden_size, eps=model.norm_eps)
                               if middle.sandwich["cross_norm"] else None)

    def forward(self, x, memory_mask, cache, memory):
        x = self.to_middle(self.attention(self.to_model(x), memory_mask, cache, memory))
        return x if self.to_middle_norm is None else self.to_middle_norm(x)


class SlimEmbedding(nn.Module):
    """The token table times ``embed_scale``, plus fairseq's positions (its sinusoids as a table
    the export writes, or its learned table), then H-SoftPOS's levels from its plugin file if
    the model has them."""

    def __init__(self, config, count_tokens=False):
        super().__init__()
        self.count_tokens = count_tokens
        self.pad = config.pad_token_id
        self.scale = config.embed_scale
        self.levels = config.hsoftpos_levels
        self.safe = config.safe is not None
        width = (config.hsoftpos_token_dim if self.levels else config.safe["hidden_size"]
                 if self.safe else config.hidden_size)
        self.table = nn.Embedding(config.vocab_size, width, self.pad)
        self.positions = (nn.Embedding(config.position_rows, width)
                          if config.positions in ("sinusoidal", "learned") else None)
        if self.levels:
            slots = config.hsoftpos_slots
            self.dilations = level_dilations(self.levels)
            widths = [width] + [slots] * (self.levels - 1)
            self.convs = nn.ModuleList(nn.Conv1d(widths[i], slots, KERNEL_SIZE, dilation=dil)
                                       for i, dil in enumerate(self.dilations))
            self.softpos = nn.ParameterList(nn.Parameter(torch.zeros(slots, slots))
                                            for _ in range(self.levels))
            self.slots = slots
        if self.safe:  # its attention's cache follows the blocks'
            safe = SideConfig(config, config.safe)
            self.self_attn = SlimAttention(safe, config.num_hidden_layers, causal=not count_tokens)
            self.self_attn_layer_norm = nn.LayerNorm(width, eps=config.norm_eps)
            self.fc1 = nn.Linear(width, width)
            self.fc2 = nn.Linear(width, config.hidden_size)
            self.output_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
            self.normalize_before = config.block == "pre-norm"

    def forward(self, input_ids, past, histories, cache=None):
        x = self.scale * self.table(input_ids)
        keep = input_ids.ne(self.pad).unsqueeze(-1)
        if self.positions is not None:  # fairseq's rows: padding_idx + 1 + position, pads pad
            if self.count_tokens:  # an encoder's (left-)padded source: its tokens counted
                rows = keep[..., 0].cumsum(1) + self.pad
            else:
                rows = (torch.arange(input_ids.size(1), device=input_ids.device) + past
                        + self.pad + 1)
            x = x + self.positions(torch.where(keep[..., 0], rows, self.pad))
        if self.safe:
            pads = None if past or bool(keep.all()) else input_ids.eq(self.pad)
            return safe_embedding(x, lambda y: self.self_attn(y, pads, cache),
                                  self.self_attn_layer_norm, self.fc1, self.fc2,
                                  self.output_layer_norm, self.normalize_before)
        if not self.levels:
            return x
        if histories is None:
            return hsoftpos_levels(x, keep, self.convs, self.dilations, self.softpos, self.slots)
        return torch.cat([hsoftpos_levels(x[:, t:t + 1], keep[:, t:t + 1], self.convs,
                                          self.dilations, self.softpos, self.slots, histories)
                          for t in range(input_ids.size(1))], dim=1)


class SlimPreTrainedModel(PreTrainedModel):
    config_class = SlimConfig
    config: SlimConfig
    base_model_prefix = "model"
    _no_split_modules = ["SlimBlock"]

    def _init_weights(self, module):
        """The weights come from the fairseq checkpoint; a fresh model gets torch's defaults."""


class SlimOutput:
    """The output projection of a language model or a translation model."""

    def build_output(self, config):
        """The output projection: SAFE's ``W h + b`` then the token table (``safe_output``),
        adaptive softmax (a head of the frequent words and one entry per cluster, then each
        cluster's projection and table), or one linear (with its bias with ``output_bias``)."""
        self.output_proj = self.output_activation = self.lm_tails = None
        adaptive = getattr(config, "adaptive_softmax", None)
        if config.safe_output != "none":
            width = config.safe["hidden_size"]
            self.output_proj = nn.Linear(config.hidden_size, width)
            self.lm_head = nn.Linear(width, config.vocab_size, bias=False)
            self.output_activation = (ACTIVATIONS[config.hidden_act]
                                      if config.safe_output == "mlp" else None)
        elif adaptive:
            self.lm_head = nn.Linear(config.hidden_size,
                                     adaptive["head_words"] + len(adaptive["tails"]), bias=False)
            self.lm_tails = nn.ModuleList(
                nn.Sequential(nn.Linear(config.hidden_size, width, bias=False),
                              nn.Linear(width, size, bias=False))
                for width, size in adaptive["tails"])
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size,
                                     bias=config.output_bias)

    def output_logits(self, hidden):
        """The logits of :meth:`build_output`'s projection (adaptive softmax: log-probabilities,
        whose softmax is the same distribution)."""
        if self.output_proj is not None:
            return safe_logits(hidden, self.output_proj, self.lm_head.weight,
                               self.output_activation)
        if self.lm_tails is not None:
            return adaptive_log_probs(hidden, self.lm_head, self.lm_tails,
                                      self.config.adaptive_softmax["head_words"])
        return self.lm_head(hidden)


class SlimStack:
    """The embedding (normalised by a LayerNorm with ``layernorm_embedding``), the blocks and
    the final norm (pre-norm blocks only) of a language model or of a translation model's
    encoder or decoder."""

    def build_stack(self, config, causal=True, memory_width=0):
        self.embed_tokens = SlimEmbedding(config, count_tokens=not causal)
        count = config.num_hidden_layers
        middle = SideConfig(config, config.sandwich) if config.sandwich else config
        projected = bool(config.sandwich) and config.sandwich["projected"]
        self.layers = nn.ModuleList(
            SlimBlock(middle, i, causal=causal, memory_width=memory_width,
                      model_config=config if projected else None) if 0 < i < count - 1
            else SlimBlock(config, i, causal=causal, memory_width=memory_width)
            for i in range(count))
        self.up = self.down = None
        if projected:  # a sandwich middle of another width: projections into it and out
            self.up = SlimProjection(config.hidden_size, middle.hidden_size, config.norm_eps)
            self.down = SlimProjection(middle.hidden_size, config.hidden_size, config.norm_eps)
        self.norm = (block_norm(config, config.hidden_size) if config.block == "pre-norm"
                     else None)
        self.layernorm_embedding = (nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
                                    if config.layernorm_embedding else None)
        self.levels = config.hsoftpos_levels

    def run_stack(self, input_ids, attention_mask=None, cache=None, memory=None,
                  memory_mask=None, cross_cache=None):
        past = 0 if cache is None else cache.get_seq_length()
        histories = None
        if cache is not None and self.levels:
            if not hasattr(cache, "histories"):  # a plain cache given by the caller
                cache.histories = {}
            histories = cache.histories
        x = self.embed_tokens(input_ids, past, histories, cache)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        key_padding_mask = padding_mask(attention_mask)  # (B, cached + new): True at padding
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if i == last and self.down is not None:
                x = self.down(x)
            x = layer(x, key_padding_mask, cache, memory, memory_mask, cross_cache)
            if i == 0 and self.up is not None:
                x = self.up(x)
        return x if self.norm is None else self.norm(x)


class SlimModel(SlimStack, SlimPreTrainedModel):
    """A language model's stack (:class:`SlimStack`)."""

    def __init__(self, config):
        super().__init__(config)
        self.build_stack(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens.table

    def set_input_embeddings(self, value):
        self.embed_tokens.table = value

    def forward(self, input_ids, attention_mask=None, cache=None):
        return self.run_stack(input_ids, attention_mask, cache)


class SlimForCausalLM(SlimOutput, SlimPreTrainedModel, GenerationMixin):
    """The language model: :class:`SlimModel` and the output projection (with its bias when
    the fairseq model has one; SAFE's output through its token table; or an adaptive softmax,
    whose log-probabilities are returned as the logits: their softmax is the same
    distribution)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.table.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.model = SlimModel(config)
        self.build_output(config)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        """The model makes its own cache (:class:`SlimCache`: H-SoftPOS's state too)."""
        return False

    def get_input_embeddings(self):
        return self.model.embed_tokens.table

    def set_input_embeddings(self, value):
        self.model.embed_tokens.table = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, labels=None,
                cache=None, past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", True)
        if use_cache and cache is None:  # (SAFE's attention keeps a layer after the blocks)
            cache = SlimCache(config=None if self.config.safe else self.config)
        if not use_cache:
            cache = None
        hidden = self.model(input_ids, attention_mask=attention_mask, cache=cache)
        logits = self.output_logits(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache})


class SlimEncoder(SlimStack, nn.Module):
    """A translation model's encoder: its blocks see the whole source."""

    def __init__(self, config):
        super().__init__()
        self.build_stack(config, causal=False)

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        return BaseModelOutput(last_hidden_state=self.run_stack(input_ids, attention_mask))


class SlimDecoder(SlimStack, nn.Module):
    """A translation model's decoder: causal blocks that attend to the encoder output."""

    def __init__(self, config, memory_width):
        super().__init__()
        self.build_stack(config, memory_width=memory_width)

    def forward(self, input_ids, attention_mask, cache, memory, memory_mask):
        self_cache = None if cache is None else cache.self_attention_cache
        return self.run_stack(input_ids, attention_mask, self_cache, memory, memory_mask, cache)


class SlimEncoderDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        encoder_config = SideConfig(config, config.encoder)
        self.encoder = SlimEncoder(encoder_config)
        self.decoder = SlimDecoder(config, encoder_config.hidden_size)


class SlimForConditionalGeneration(SlimOutput, SlimPreTrainedModel, GenerationMixin):
    """The translation model: :class:`SlimEncoder`, :class:`SlimDecoder` and the output
    projection (with its bias when the fairseq model has one). The cache is transformers'
    :class:`EncoderDecoderCache`: a :class:`SlimCache` for the decoder's self-attention and
    H-SoftPOS, the encoder output's keys and values for the cross-attention."""

    _no_split_modules = ["SlimBlock"]

    def __init__(self, config):
        super().__init__(config)
        self.model = SlimEncoderDecoder(config)
        self.build_output(config)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        """The model makes its own cache (:class:`SlimCache` inside: H-SoftPOS's state too)."""
        return False

    def get_encoder(self):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def get_input_embeddings(self):
        return self.model.encoder.embed_tokens.table

    def set_input_embeddings(self, value):
        self.model.encoder.embed_tokens.table = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_outputs=None, use_cache=None, labels=None,
                cache=None, past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", True)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(SlimCache(), DynamicCache())
        if not use_cache:
            cache = None
        if labels is not None and decoder_input_ids is None:  # the targets after </s>
            start = labels.new_full((labels.size(0), 1), self.config.decoder_start_token_id)
            shifted = torch.cat([start, labels[:, :-1]], dim=1)
            decoder_input_ids = shifted.masked_fill(shifted.eq(-100), self.config.pad_token_id)
        if encoder_outputs is None:
            encoder_outputs = self.model.encoder(input_ids, attention_mask)
        memory = encoder_outputs[0]
        hidden = self.model.decoder(decoder_input_ids, decoder_attention_mask, cache, memory,
                                    padding_mask(attention_mask))
        logits = self.output_logits(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                   ignore_index=-100)
        return Seq2SeqLMOutput(loss=loss, logits=logits, encoder_last_hidden_state=memory,
                               **{CACHE: cache})
