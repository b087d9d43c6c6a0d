"""``slim_lm``: decoder-only LM (fairseq ``language_modeling`` task) with the plugin's techniques.

Uses the same decoder as ``slim_transformer`` without encoder attention, so every option of
slim_options (gates, GLU, H-SoftPOS, Tensor Chain, SAFE, sandwich sharing) applies.
"""
from fairseq import options
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)
from fairseq.modules import AdaptiveInput

from slim_fairseq.models.slim_options import add_slim_args, set_slim_defaults, validate_slim_args
from slim_fairseq.models.slim_transformer import (
    ContractOverridesMixin,
    SlimTransformerDecoder,
    finish_build,
)
from slim_fairseq.modules.input_embedding import build_token_table, token_table_dim
from slim_fairseq.modules.weight_tying import (
    add_tying_args,
    apply_weight_tying,
    tying_enabled,
    validate_tying,
)
from slim_fairseq.option_errors import check_task, one_line_option_errors


@register_model("slim_lm")
class SlimLanguageModel(ContractOverridesMixin, TransformerLanguageModel):
    """Decoder-only transformer LM with the plugin's techniques as options."""

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_slim_args(parser)
        add_tying_args(parser)  # STLM weight tying (docs/TECHNIQUES.md#tying-schemes, issue 5)

    @classmethod
    def check_args(cls, args, task=None):
        """Option checks that need no data (run right after parsing and again at build)."""
        validate_slim_args(args)
        # options of the encoder-decoder's cross-attention: refused, never silently ignored
        for flag, attr, default in (("--cross-attn-gate", "cross_attn_gate", "none"),
                                    ("--sandwich-cross-norm", "sandwich_cross_norm", "layernorm")):
            if getattr(args, attr) != default:
                raise ValueError(f"{flag}={getattr(args, attr)} acts on cross-attention, which a "
                                 "language model does not have; drop it")
        validate_tying(args, args.decoder_layers)
        check_task(True, getattr(args, "arch", "slim_lm"),
                   task if task is not None else getattr(args, "task", None))

    @classmethod
    def build_model(cls, args, task):
        with one_line_option_errors():
            return cls._build_model(args, task)

    @classmethod
    def _build_model(cls, args, task):
        slim_lm_base(args)
        cls.check_args(args, task)
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample",
                                                DEFAULT_MAX_TARGET_POSITIONS)
        if getattr(args, "character_embeddings", False):
            raise ValueError("--character-embeddings is not supported by slim_lm")
        dictionary = task.source_dictionary
        if args.adaptive_input:
            if args.hsoftpos_levels or args.safe_embed_dim or args.tc_emb:
                raise ValueError("--adaptive-input replaces the token table; it cannot be combined "
                                 "with --hsoftpos-levels, --safe-embed-dim or --tc-emb")
            table = AdaptiveInput(
                len(dictionary), dictionary.pad(), args.decoder_input_dim,
                args.adaptive_input_factor, args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq, args.quant_noise_pq_block_size)
        else:
            cfg = TransformerConfig.from_namespace(args)
            table = build_token_table(cfg, dictionary, token_table_dim(cfg, args.decoder_input_dim))
        if args.tie_adaptive_weights:
            if not args.adaptive_input:
                raise ValueError("--tie-adaptive-weights needs --adaptive-input")
            if (args.adaptive_input_factor != args.adaptive_softmax_factor
                    or args.adaptive_softmax_cutoff != args.adaptive_input_cutoff
                    or args.decoder_input_dim != args.decoder_output_dim):
                raise ValueError("--tie-adaptive-weights needs equal adaptive input/softmax "
                                 "factors, cutoffs and decoder input/output dims")
        decoder = SlimTransformerDecoder(TransformerConfig.from_namespace(args),
                                         task.target_dictionary, table, no_encoder_attn=True)
        model = finish_build(cls(decoder), args)
        if tying_enabled(args):  # STLM FFN / attention-projection tying + LoRA (arXiv:2405.14159)
            apply_weight_tying(decoder.layers, args)
        return model

    @classmethod
    def contract_overrides(cls, arch):
        tiny = []
        for key, value in cls.TINY.items():
            tiny += [f"--decoder-{key.replace('_', '-')}", value]
        tiny += ["--decoder-input-dim", cls.TINY["embed_dim"],
                 "--decoder-output-dim", cls.TINY["embed_dim"]]
        return tiny + cls.technique_overrides(cls.arch_defaults(arch))


@register_model_architecture("slim_lm", "slim_lm")
def slim_lm_base(args):
    """fairseq's transformer_lm with every technique off."""
    set_slim_defaults(args)
    base_lm_architecture(args)
