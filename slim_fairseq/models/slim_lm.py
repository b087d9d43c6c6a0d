"""``slim_lm``: the plugin's decoder-only LM (fairseq ``language_modeling`` task).

The decoder of ``slim_transformer`` without encoder attention, so every option of
:mod:`~slim_fairseq.models.slim_options` applies, and the LM-only ones too: Anthe (gates, GLU,
H-SoftPOS, Tensor Chain), Subformer (SAFE, sandwich sharing), STLM (tying with LoRA; the block
of its presets is ``--norm rmsnorm --decoder-normalize-before --ffn-glu --glu-hidden full
--kv-heads 4 --rope-theta 10000 --no-linear-bias``) and skipless blocks (``--skipless-layout``,
weight removal). The ``stlm_*`` and ``skipless_lm*`` architectures are presets of this model
(``archs_stlm.py``, ``archs_skipless.py``).
"""
import argparse

from fairseq import options
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)
from fairseq.modules import AdaptiveInput

from slim_fairseq.checkpoint_upgrade import upgrade_state_dict
from slim_fairseq.models.presets import Preset, apply_preset, model_defaults
from slim_fairseq.models.slim_options import (
    add_fairseq_args,
    add_slim_args,
    check_adaptive_cutoffs,
    extend_fairseq_args,
    set_slim_defaults,
    validate_slim_args,
)
from slim_fairseq.models.slim_transformer import (
    ChainsBuiltTogetherMixin,
    SlimTransformerDecoder,
    WeightsCheckMixin,
    finish_build,
    task_data_record,
    token_table,
)
from slim_fairseq.option_errors import check_task, one_line_option_errors, option_error, prog_name
from slim_fairseq.run_checks import mark_command_line


@register_model("slim_lm")
class SlimLanguageModel(ChainsBuiltTogetherMixin, WeightsCheckMixin, TransformerLanguageModel):
    """Decoder-only transformer LM with the plugin's techniques as options."""

    SIDES = ("decoder",)

    def __init__(self, decoder, args=None):
        super().__init__(decoder)
        # the options it was built with, kept as fairseq's TransformerModel keeps its own: a user's
        # slim_fairseq.weight_removal.reduce_model(model) rebuilds the reduced model from them
        self.args = args

    @classmethod
    def add_args(cls, parser):
        add_fairseq_args(parser, TransformerLanguageModelConfig, delete_default=True)
        add_slim_args(parser)
        extend_fairseq_args(parser)
        add_translation_only_args(parser)
        mark_command_line(parser)

    @classmethod
    def check_args(cls, args, task=None):
        """Option checks that need no data (right after parsing, and with the task when the
        model is built; the options' rules run once for equal options). Returns the
        :class:`~slim_fairseq.models.slim_options.ModelOptions`."""
        given = getattr(args, "translation_only_flags", None)
        if given:
            raise option_error(given[0], None, f"an option of the encoder-decoder (translation) "
                               f"models, and {getattr(args, 'arch', 'slim_lm')} is a language model "
                               "(a decoder only, shaped by the --decoder-* options)",
                               alternatives=[{flag: None for flag in given}])
        model_options = validate_slim_args(args, "slim_lm")
        check_task(True, getattr(args, "arch", "slim_lm"),
                   task if task is not None else getattr(args, "task", None))
        if getattr(args, "character_embeddings", False):
            raise option_error("--character-embeddings", None, "not built by slim_lm",
                               "fairseq's transformer_lm for character embeddings")
        if args.tie_adaptive_weights and not args.adaptive_input:
            raise option_error("--tie-adaptive-weights", None, "ties an adaptive input, which "
                               "is off", "add --adaptive-input")
        return model_options

    @classmethod
    def build_model(cls, args, task):
        apply_preset(args, "slim_lm")
        with one_line_option_errors():
            return cls._build_model(args, task, cls.check_args(args, task))

    @classmethod
    def _build_model(cls, args, task, model_options):
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample",
                                                DEFAULT_MAX_TARGET_POSITIONS)
        dictionary = getattr(task, "source_dictionary", None) or task.target_dictionary
        if dictionary is None:
            where = _data_path(task)
            where = f"in the data directory {where}" if where else "(the data directory given does not exist)"
            raise option_error("--task", getattr(args, "task", "language_modeling"),
                               f"found no dictionary (dict.txt) {where}", "the data-bin the model was "
                               "trained on (fairseq-eval-lm DATA, or from_pretrained(..., "
                               "data_name_or_path=DATA))")
        check_adaptive_cutoffs(args, len(dictionary))
        if args.adaptive_input:
            table = AdaptiveInput(
                len(dictionary), dictionary.pad(), args.decoder_input_dim,
                args.adaptive_input_factor, args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq, args.quant_noise_pq_block_size)
        else:
            table = token_table(args, dictionary, args.decoder_input_dim)
        if args.tie_adaptive_weights and (
                args.adaptive_input_factor != args.adaptive_softmax_factor
                or args.adaptive_softmax_cutoff != args.adaptive_input_cutoff
                or args.decoder_input_dim != args.decoder_output_dim):
            raise option_error("--tie-adaptive-weights", None, "needs equal adaptive input/softmax "
                               "factors, cutoffs and decoder input/output dims", "matching values")
        decoder = SlimTransformerDecoder(TransformerConfig.from_namespace(args),
                                         task.target_dictionary, table, no_encoder_attn=True)
        model = cls(decoder, args)
        model.data_record = task_data_record(task, lm=True)
        return finish_build(model, model_options, [decoder.layers])

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints of the earlier LM classes (their layer and table names;
        :mod:`slim_fairseq.checkpoint_upgrade`), then fairseq's own upgrades."""
        upgrade_state_dict(state_dict, name, tied=self.decoder.share_input_output_embed)
        super().upgrade_state_dict_named(state_dict, name)

    def prepare_for_inference_(self, cfg):
        """Refuse blocks longer than the positions the model has: in fairseq-eval-lm fairseq
        would skip every block and print ``Perplexity: 1.00``; fairseq-generate would stop with
        a traceback on the first sample."""
        task_cfg = getattr(cfg, "task", None)
        block = getattr(task_cfg, "tokens_per_sample", None) if task_cfg is not None else None
        tool = _reading_tool()
        limit = self.decoder.max_positions()
        if block and limit and tool == "eval_lm":
            block += getattr(getattr(cfg, "eval_lm", None), "context_window", 0) or 0
            if block > limit:
                raise option_error("--tokens-per-sample", block, f"blocks longer than the {limit} "
                                   "positions the model has are all skipped (the perplexity "
                                   "would be of nothing)", f"at most {limit}, with "
                                   "--context-window")
        if block and limit and tool == "generate" and block > limit:
            raise option_error("--tokens-per-sample", block, f"longer than the {limit} positions "
                               "the model has: fairseq-generate refuses every longer sample",
                               f"--tokens-per-sample {limit} or less with --sample-break-mode eos "
                               "--skip-invalid-size-inputs-valid-test (one line per sample; longer "
                               "lines are skipped), or fairseq-interactive --task "
                               "language_modeling (or the hub's sample()) to continue your own "
                               "prompts")
        super().prepare_for_inference_(cfg)


def _data_path(task):
    for holder in (getattr(task, "cfg", None), getattr(task, "args", None)):
        if getattr(holder, "data", None):
            return holder.data
    return None


def _reading_tool():
    """"eval_lm" or "generate" in fairseq-eval-lm or fairseq-generate (the running program, as
    its error lines name it), where ``--tokens-per-sample`` is the length of the blocks read;
    None elsewhere (the hub, fairseq-interactive ignore it)."""
    return {"fairseq-eval-lm": "eval_lm", "fairseq-generate": "generate"}.get(prog_name())


class TranslationOnly(argparse.Action):
    """An option of the encoder-decoder models given to a language model: noted, and refused in
    one line by ``check_args`` (argparse would print its whole usage)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "translation_only_flags", None) or []
        setattr(namespace, "translation_only_flags", given + [option_string])


def add_translation_only_args(parser):
    """The options of ``slim_transformer`` (fairseq's transformer's and the plugin's) that a
    language model does not take, hidden: given, they are refused by name."""
    from slim_fairseq.models.slim_transformer import SlimTransformerModel
    translation = argparse.ArgumentParser(add_help=False)
    SlimTransformerModel.add_args(translation)
    for action in translation._actions:
        flags = [f for f in action.option_strings if f not in parser._option_string_actions]
        if flags and len(flags) == len(action.option_strings):
            parser.add_argument(*flags, action=TranslationOnly, default=argparse.SUPPRESS,
                                nargs=0 if action.nargs == 0 else None, help=argparse.SUPPRESS)


@model_defaults("slim_lm")
def slim_lm_defaults(args):
    """The plugin's option defaults, then fairseq's transformer_lm base, pre-norm unless
    ``--no-decoder-normalize-before`` (fairseq's base_lm_architecture sets pre-norm whatever it
    is given)."""
    set_slim_defaults(args)
    post_norm = getattr(args, "decoder_normalize_before", None) is False
    base_lm_architecture(args)
    if post_norm:
        args.decoder_normalize_before = False


SLIM_LM = Preset.row("slim_lm", "slim_lm", "fairseq's transformer_lm with every technique off, "
                     "pre-norm unless --no-decoder-normalize-before.").register()
