"""``slim_transformer``: fairseq's transformer with every slimming technique as an option.

Anthe (gates, GLU, H-SoftPOS, Tensor Chain; arXiv:2305.10991), Subformer (SAFE, sandwich
sharing; arXiv:2101.00234), STLM (FFN / attention-projection tying with LoRA; the block's GQA,
RoPE, RMSNorm; arXiv:2405.14159) switch on by options of :mod:`slim_options` and combine
freely; the decoder and its layers are also ``slim_lm``'s. Named architectures are presets that
only set defaults (``archs_*.py``). The options are read into a
:class:`~slim_fairseq.models.slim_options.ModelOptions` and checked once per build; every part is
built from the specs it gives. Extension points: docs/DESIGN.md.
"""
import copy
import dataclasses
import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules import AdaptiveSoftmax
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq import utils

from slim_fairseq.models.presets import Preset, apply_preset, model_defaults
from slim_fairseq.models.slim_layers import (
    OUTPUT_PROJECTIONS,
    SkiplessDecoderLayer,
    SlimDecoderLayer,
    SlimEncoderLayer,
    build_norm,
    layout_class,
)
from slim_fairseq.models.slim_options import (
    ModelOptions,
    OutputVariant,
    SandwichOptions,
    add_fairseq_args,
    add_slim_args,
    check_adaptive_cutoffs,
    extend_fairseq_args,
    set_slim_defaults,
    techniques_on,
    validate_slim_args,
)
from slim_fairseq.modules.attention import mark_causal
from slim_fairseq.modules.dropout import slim_dropouts
from slim_fairseq.modules.initialization import bert_init_, gpt2_init_
from slim_fairseq.modules.input_embedding import build_input_embedding, build_token_table
from slim_fairseq.modules.safe import SAFEOutputProjection
from slim_fairseq.modules.sandwich import SandwichCrossAttention, build_sandwich_stack
from slim_fairseq.modules.skipless import init_skipless_table_
from slim_fairseq.modules.tensor_chain import TensorChainLinear, built_together, two_core_chains
from slim_fairseq.modules.tensor_chain_policy import force_modes_
from slim_fairseq.modules.weight_tying import apply_weight_tying
from slim_fairseq import data_record
from slim_fairseq.option_errors import OptionError, check_task, one_line_option_errors, option_error
from slim_fairseq.run_checks import mark_command_line


def _wrap_layer(cfg, layer):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's own stacks do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def _swap_final_norm(module, cfg, options):
    """fairseq's final LayerNorm (pre-norm stacks) as ``--norm`` selects."""
    spec = options.norm_spec(cfg.export)
    if getattr(module, "layer_norm", None) is not None and spec.kind != "layernorm":
        module.layer_norm = build_norm(spec, module.layer_norm.normalized_shape[0]
                                       if hasattr(module.layer_norm, "normalized_shape")
                                       else module.layer_norm.weight.shape[0])


def _without_layers(cfg, side):
    """A copy of ``cfg`` whose ``side`` has no layers, for fairseq's encoder and decoder
    constructors: the plugin builds the layer stack itself (``build_layers``), and ``cfg`` is
    not changed."""
    fairseq_cfg = copy.copy(cfg)
    sub = copy.copy(getattr(cfg, side))
    sub.layers = 0
    setattr(fairseq_cfg, side, sub)
    return fairseq_cfg


class _LayerStackMixin:
    """The layer stack of an encoder or decoder, built by the plugin (fairseq's constructor gets
    a copy of the config with no layers): ``build_layer(cfg, spec)`` for each layer, or the
    sandwich stack (``--sandwich``) whose middle layers are built from a copy of ``cfg`` at the
    middle's width. A sandwich stack is not fairseq's in any case: its attentions are the
    plugin's (fairseq's parameters and outputs, torch's fused attention, fewer launches)."""

    def build_layers(self, cfg, side):
        options = self.options
        spec = options.sandwich_spec(cfg, side)
        if spec is None:
            layer_spec = options.layer_spec(cfg, side)
            return [self.build_layer(cfg, layer_spec) for _ in range(getattr(cfg, side).layers)]
        middle_cfg = SandwichOptions.middle_layer_cfg(cfg, side, spec)
        middle_spec = _plugin_attention(options.layer_spec(middle_cfg, side))
        first, middle = self.build_layer(cfg, _plugin_attention(options.layer_spec(cfg, side))), []
        for _ in range(spec.layers - 2):
            layer = self.build_layer(middle_cfg, middle_spec)
            if spec.wider and getattr(layer, "encoder_attn", None) is not None:
                # a wider middle attends to the encoder at the model width
                layer.encoder_attn = SandwichCrossAttention.around(
                    layer.build_encoder_attention(spec.model_dim, cfg), spec)
            middle.append(layer)
        return build_sandwich_stack(spec, first, middle, self.build_layer(
            cfg, _plugin_attention(options.layer_spec(cfg, side))))


def _plugin_attention(layer_spec):
    """``layer_spec`` whose attentions with no technique on are the plugin's."""
    return dataclasses.replace(layer_spec, plugin_attention=True)


class SlimTransformerEncoder(_LayerStackMixin, TransformerEncoderBase):
    """Encoder whose input embedding and layer stack come from the options.

    ``embed_tokens`` is the token table; it is wrapped by :func:`build_input_embedding`.
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False, options=None):
        options = options or ModelOptions.of(cfg, "slim_transformer")
        input_embedding = build_input_embedding(options.embedding_spec(cfg, "encoder"), embed_tokens)
        super().__init__(_without_layers(cfg, "encoder"), dictionary, input_embedding,
                         return_fc=return_fc)
        self.cfg = cfg
        self.options = options
        self.embed_positions = None  # positions live in the input embedding
        slim_dropouts(self, ("dropout_module",))
        _swap_final_norm(self, cfg, options)
        self.layers.extend(self.build_layers(cfg, "encoder"))
        self.num_layers = len(self.layers)

    def build_layer(self, cfg, spec=None):
        return self.build_encoder_layer(cfg, spec)

    def build_encoder_layer(self, cfg, spec=None):
        layer_cls = layout_class(spec, "encoder") or SlimEncoderLayer
        return _wrap_layer(cfg, layer_cls(cfg, return_fc=self.return_fc, spec=spec))

    def forward_embedding(self, src_tokens, token_embedding: Optional[Tensor] = None):
        if token_embedding is not None:
            raise ValueError("token_embedding: slim_transformer embeds its tokens itself; "
                             "allowed: None")
        x = embed = self.embed_tokens(src_tokens)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed

    def max_positions(self):
        return self.max_source_positions


class SlimTransformerDecoder(_LayerStackMixin, TransformerDecoderBase):
    """Decoder whose input embedding, layer stack and output projection come from the options."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None,
                 options=None):
        options = options or ModelOptions.of(cfg, "slim_lm" if no_encoder_attn else "slim_transformer")
        input_embedding = build_input_embedding(options.embedding_spec(cfg, "decoder"), embed_tokens)
        self.no_encoder_attn = no_encoder_attn
        self.options = options  # read by build_output_projection in fairseq's constructor
        super().__init__(_without_layers(cfg, "decoder"), dictionary, input_embedding,
                         no_encoder_attn=no_encoder_attn, output_projection=output_projection)
        self.cfg = cfg
        self.embed_positions = None  # positions live in the input embedding
        slim_dropouts(self, ("dropout_module",))
        _swap_final_norm(self, cfg, options)
        self.layers.extend(self.build_layers(cfg, "decoder"))
        self.num_layers = len(self.layers)

    def build_layer(self, cfg, spec=None):
        return self.build_decoder_layer(cfg, self.no_encoder_attn, spec)

    def build_decoder_layer(self, cfg, no_encoder_attn=False, spec=None):
        layer_cls = layout_class(spec, "decoder")
        if layer_cls is not None:
            return _wrap_layer(cfg, layer_cls(cfg, no_encoder_attn, spec=spec))
        if self.options.skipless_layout != "none":
            return _wrap_layer(cfg, SkiplessDecoderLayer(cfg, spec=spec))
        return _wrap_layer(cfg, SlimDecoderLayer(cfg, no_encoder_attn, spec=spec))

    def build_output_projection(self, cfg, dictionary, embed_tokens):
        """Vocabulary projection: adaptive softmax, SAFE, Tensor Chain, dense (tied or not), or
        one registered from outside."""
        options = self.options
        table = embed_tokens.table if hasattr(embed_tokens, "table") else embed_tokens
        vocab = len(dictionary)
        variant = next(iter(techniques_on(options, OutputVariant)), None)
        if variant is not None:
            self.output_projection = OUTPUT_PROJECTIONS[type(variant)](
                variant, table, self.output_embed_dim, vocab, self.share_input_output_embed)
        elif cfg.adaptive_softmax_cutoff is not None:
            self.adaptive_softmax = AdaptiveSoftmax(
                vocab, self.output_embed_dim,
                utils.eval_str_list(cfg.adaptive_softmax_cutoff, type=int),
                dropout=cfg.adaptive_softmax_dropout,
                adaptive_inputs=table if cfg.tie_adaptive_weights else None,
                factor=cfg.adaptive_softmax_factor, tie_proj=cfg.tie_adaptive_proj)
        elif options.safe_embed_dim:
            self.output_projection = SAFEOutputProjection.from_spec(
                options.safe_output_spec(), table, self.output_embed_dim, vocab)
        elif options.tc_output:
            chain = options.chain("tc_output")
            self.output_projection = TensorChainLinear(
                self.output_embed_dim, vocab, ratio=chain.ratio, length=chain.length,
                bias=options.output_bias, min_bond=chain.min_bond)
        else:
            bias = options.output_bias
            if self.share_input_output_embed:
                weight = getattr(table, "weight", None)
                # the options' rules leave a tied output only a dense table of its width
                assert isinstance(weight, nn.Parameter) and \
                    weight.shape == (vocab, self.output_embed_dim), weight
                self.output_projection = nn.Linear(self.output_embed_dim, vocab, bias=bias)
                self.output_projection.weight = weight
            else:
                self.output_projection = nn.Linear(self.output_embed_dim, vocab, bias=bias)
                nn.init.normal_(self.output_projection.weight, mean=0,
                                std=self.output_embed_dim ** -0.5)
            if bias:
                nn.init.zeros_(self.output_projection.bias)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """fairseq's decoder pass (``TransformerDecoderBase.extract_features_scriptable``) with two
        changes: the input embedding gets the incremental state, because H-SoftPOS convolutions
        and SAFE attention keep a cache per step, and positions live in it; the future mask is
        built once, not per layer, and marked causal (:func:`mark_causal`). Copied because the
        embedding is computed inside fairseq's method; tests/test_attention.py pins this pass
        to fairseq's own output with every option off."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        x = self.embed_tokens(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        # one future mask for every layer (fairseq builds it per layer), marked so that the
        # plugin's attention runs torch's fused causal kernel instead of reading it
        self_attn_mask = (mark_causal(self.buffered_future_mask(x))
                          if incremental_state is None and not full_context_alignment else None)
        for idx, layer in enumerate(self.layers):
            x, layer_attn, _ = layer(
                x, enc, padding_mask, incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def max_positions(self):
        return self.max_target_positions


def token_table(args, dictionary, model_dim):
    """The token table for an input embedding at ``model_dim`` with the options of ``args``:
    its width (the model's, H-SoftPOS's d_emb or SAFE's d_e) and its Tensor Chain."""
    options = ModelOptions.of(args)
    cfg = TransformerConfig.from_namespace(args)
    return build_token_table(options.chain("tc_emb"), dictionary,
                             options.token_table_dim(cfg, model_dim))


def finish_build(model, options, stacks):
    """Post-build steps shared by the encoder-decoder model and the LM, in this order: the
    whole-model init (``--bert-init``, ``--init-std``; skipless token tables), weight tying
    with LoRA over each layer stack in ``stacks``, and ``--tc-forward`` / ``--tc-backward`` on every
    Tensor Chain (``options``: the model's :class:`ModelOptions`)."""
    if options.bert_init:
        bert_init_(model)
    if options.init_std:
        gpt2_init_(model, options.init_std, stacks)
    if options.skipless_layout != "none":
        table = getattr(model.decoder.embed_tokens, "table", None)
        # RMS 1 at the first block: the sqrt(d) scale, or rows that long under --no-scale-embedding
        row_norm = math.sqrt(options.decoder_embed_dim) / model.decoder.embed_scale
        init_skipless_table_(table, getattr(table, "padding_idx", None), row_norm)
    tying = options.tying_spec()
    if tying.on:  # STLM FFN / attention-projection tying + LoRA (arXiv:2405.14159)
        for layers in stacks:
            apply_weight_tying(layers, tying)
    force_modes_(model, options.tc_forward, options.tc_backward)
    return model


class ChainsBuiltTogetherMixin:
    """``forward`` in which the Tensor-Chain weights of one shape, across all layers, are built
    in one batched product and differentiated in one (:func:`built_together`): a training step
    launches a few products for all its chain weights instead of a few per weight."""

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return super().forward(*args, **kwargs)
        with built_together(two_core_chains(self)):
            return super().forward(*args, **kwargs)


class WeightsCheckMixin:
    """``load_state_dict`` that refuses, in one line, weights of another model (fairseq-train
    resuming a --save-dir of another architecture or other options; fairseq would stop with a
    traceback and "please ensure that the architectures match") and a checkpoint trained with
    other dictionaries than the data the model was built for (:mod:`slim_fairseq.data_record`).
    fairseq's trainer wraps the refusal in an ``Exception`` of its own; the plugin's command edge
    finds the refusal in it and prints its one line
    (:func:`slim_fairseq.option_errors.install_command_edge`).

    The model's :attr:`data_record` (set by ``build_model``) is its extra state, so it is in
    every checkpoint; a checkpoint's run id is taken over when it is loaded."""

    data_record = None

    def get_extra_state(self):
        return copy.deepcopy(self.data_record)

    def set_extra_state(self, state):
        if data_record.is_record(state) and self.data_record is not None:
            self.data_record = dict(self.data_record, run=state["run"])

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        if data_record.KEY not in state_dict:  # written before the record: loads as it did
            state_dict[data_record.KEY] = None
        trained = data_record.of_state(state_dict)
        if trained is not None and self.data_record is not None:
            checkpoint = data_record.checkpoint_being_loaded() or "the checkpoint"
            problem = data_record.mismatch(self.data_record, trained, checkpoint)
            if problem:  # a line in the format (data_record.mismatch), passed on
                raise OptionError(str(problem))
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError:
            if not strict:
                raise
            own = {k: tuple(v.shape) for k, v in self.state_dict().items() if hasattr(v, "shape")}
            given = {k: tuple(v.shape) for k, v in state_dict.items() if hasattr(v, "shape")}
            missing = sorted(set(own) - set(given))
            unexpected = sorted(set(given) - set(own))
            reshaped = sorted(k for k in set(own) & set(given) if own[k] != given[k])
            example = (missing or unexpected or reshaped or ["?"])[0]
            arch = getattr(getattr(self, "args", None), "arch", None) or type(self).__name__
            error = option_error("--arch", arch, f"the checkpoint's weights are another model's "
                                 f"({len(missing)} missing, {len(unexpected)} unexpected, {len(reshaped)} "
                                 f"of another shape, e.g. {example})", "the arch and options the "
                                 "checkpoint was trained with, or a --save-dir of its own when training")
            raise error from None


def task_data_record(task, lm):
    """The record (:mod:`slim_fairseq.data_record`) of the dictionaries ``task`` gives a model:
    a language model's one dictionary, a translation model's source and target."""
    import os
    data = None
    for holder in (getattr(task, "cfg", None), getattr(task, "args", None)):
        if getattr(holder, "data", None):
            data = str(holder.data).split(os.pathsep)[0]
            break
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)

    def file(name):
        return os.path.join(data, name) if data else None

    if lm:
        dictionary = getattr(task, "source_dictionary", None) or task.target_dictionary
        entries = {"dictionary": data_record.dictionary_entry(dictionary.symbols, file("dict.txt"))}
    else:
        src, tgt = getattr(task_cfg, "source_lang", None), getattr(task_cfg, "target_lang", None)
        entries = {
            "source": data_record.dictionary_entry(task.source_dictionary.symbols,
                                                   file(f"dict.{src}.txt") if src else None),
            "target": data_record.dictionary_entry(task.target_dictionary.symbols,
                                                   file(f"dict.{tgt}.txt") if tgt else None)}
    return data_record.make(entries, os.path.abspath(data) if data else None)


def check_languages(args, task):
    """The languages the model was trained to translate (its saved options) against those of
    the task it is loaded into (fairseq-generate's --source-lang / --target-lang): swapped
    languages would translate from the wrong side, BLEU near 0, without a word. When training,
    the task's languages are recorded in the model's options."""
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    reads = (getattr(task_cfg, "source_lang", None), getattr(task_cfg, "target_lang", None))
    trained = (getattr(args, "source_lang", None), getattr(args, "target_lang", None))
    if None in reads:
        return
    if None in trained:
        args.source_lang, args.target_lang = reads
    elif trained != reads:
        raise option_error("--source-lang", reads[0], f"the model was trained to translate "
                           f"{trained[0]} -> {trained[1]}, and this run reads {reads[0]} -> {reads[1]}",
                           alternatives=[{"--source-lang": trained[0], "--target-lang": trained[1]}])


@register_model("slim_transformer")
class SlimTransformerModel(ChainsBuiltTogetherMixin, WeightsCheckMixin, TransformerModel):
    """Encoder-decoder transformer with the plugin's techniques as options (docs/DESIGN.md)."""

    @classmethod
    def add_args(cls, parser):
        add_fairseq_args(parser, TransformerConfig, delete_default=True, with_prefix="")
        add_slim_args(parser)
        extend_fairseq_args(parser)
        mark_command_line(parser)

    @classmethod
    def check_args(cls, args, task=None):
        """Option checks that need no data (right after parsing, and with the task when the
        model is built; the options' rules run once for equal options). Returns the
        :class:`ModelOptions`."""
        options = validate_slim_args(args, "slim_transformer")
        check_task(False, getattr(args, "arch", "slim_transformer"),
                   task if task is not None else getattr(args, "task", None))
        return options

    @classmethod
    def build_model(cls, args, task):
        apply_preset(args, "slim_transformer")
        with one_line_option_errors():
            options = cls.check_args(args, task)
            check_languages(args, task)
            check_adaptive_cutoffs(args, len(task.target_dictionary))
            model = super().build_model(args, task)
            model.data_record = task_data_record(task, lm=False)
            return finish_build(model, options, [model.encoder.layers, model.decoder.layers])

    @classmethod
    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        table = token_table(args, dictionary, embed_dim)
        if path:  # (the options' rules leave a path only to a dense table of the model width)
            utils.load_embedding(utils.parse_embedding(path), dictionary, table)
        return table

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SlimTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return SlimTransformerDecoder(TransformerConfig.from_namespace(args), tgt_dict, embed_tokens,
                                      no_encoder_attn=args.no_cross_attention)


@model_defaults("slim_transformer")
def slim_transformer_defaults(args):
    """The plugin's option defaults, then fairseq's transformer base."""
    set_slim_defaults(args)
    base_architecture(args)


SLIM_TRANSFORMER = Preset.row("slim_transformer", "slim_transformer",
                              "fairseq's transformer base with every technique off.").register()
