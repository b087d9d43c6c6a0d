"""The model an export reads: a fairseq checkpoint loaded the way fairseq loads it, its Tensor
Chains materialised (:func:`slim_fairseq.compression.densify`), its tensors read by name.

:class:`Reader` hands out the built model's parameters by their state-dict names and records
which it gave: a layout must place every parameter of the model (a parameter no layout knows,
e.g. of a block changed later, fails the export instead of being dropped). Shared parameters
(STLM tying, sandwich middles, tied embeddings) are read once per name, so each layer gets its
copy; a LoRA adapter is folded into its layer's weight, ``W + alpha/r * B A`` (Hu et al.,
arXiv:2106.09685, Sec. 4.1).
"""
import dataclasses
import math

import torch
from torch import nn

from slim_fairseq import compression
from slim_fairseq.option_errors import OptionError, option_error

LANGUAGE_MODELS = ("slim_lm", "transformer_lm")
TRANSLATION_MODELS = ("slim_transformer", "transformer")


@dataclasses.dataclass
class Source:
    """A checkpoint ready to map: ``model`` is dense and in float32 eval mode; ``original`` is
    the checkpoint's own model (with its Tensor Chains), the reference of the self-check."""

    path: str
    cfg: object
    state: dict
    args: object
    arch: str
    model_name: str
    task: object
    model: nn.Module
    original: nn.Module
    densified: bool

    @property
    def lm(self):
        return self.model_name in LANGUAGE_MODELS

    @property
    def dictionary(self):
        return self.task.target_dictionary

    @property
    def source_dictionary(self):
        return self.task.source_dictionary

    def parameters(self, model=None):
        """Distinct parameters (shared ones once) of ``model`` (default: the checkpoint's)."""
        return sum(p.numel() for p in (model or self.original).parameters())


def load(path, data=None):
    """:class:`Source` of the checkpoint at ``path``; ``data``: the data-bin with its
    dictionaries (default: the one it was trained on)."""
    from slim_fairseq.models.slim_options import TC_PLACES, set_slim_defaults
    try:
        cfg, state = compression.load_checkpoint(path, data)
    except OptionError:
        raise
    except Exception:  # torch.load of a truncated or foreign file
        raise option_error("CHECKPOINT", path, "cannot be read: truncated, partly copied or not "
                           "a checkpoint", "a complete checkpoint file written by "
                           "fairseq-train") from None
    arch = compression._arch_of(cfg.model)
    model_name = compression._model_name(arch)
    if model_name not in LANGUAGE_MODELS + TRANSLATION_MODELS:
        raise option_error("CHECKPOINT", path, f"a checkpoint of arch {arch!r} (model "
                           f"{model_name or 'unknown'}), which has no export", "a checkpoint of "
                           "slim_lm or slim_transformer (any of their archs), or of fairseq's "
                           "transformer_lm or transformer")
    check_dictionaries(cfg, state, data, model_name in LANGUAGE_MODELS)
    task, model = compression.build_checkpoint_model(cfg, state, data_name="DATA")
    args = compression._namespace(cfg.model)
    set_slim_defaults(args)  # fairseq's own models: every option of the plugin off
    densified = any(float(getattr(args, place, 0) or 0) for place in TC_PLACES)
    mapped = compression.densify(cfg, state, model)[1] if densified else model
    return Source(path=path, cfg=cfg, state=state, args=args, arch=arch, model_name=model_name,
                  task=task, model=mapped.float().eval(), original=model.float().eval(),
                  densified=densified)


def check_dictionaries(cfg, state, data, lm):
    """Refuse a data-bin whose dictionaries cannot be the checkpoint's: a file the task needs
    is missing (e.g. a language model's data-bin for a translation checkpoint), or a
    dictionary's size is not the rows of the embedding the model was trained with."""
    import os

    from fairseq.data import Dictionary
    data = data or str(getattr(cfg.task, "data", "") or "").split(os.pathsep)[0]
    if not data:
        return
    if lm:
        files = {"decoder": "dict.txt"}
        model = "language model"
    else:
        source, target = getattr(cfg.task, "source_lang", None), getattr(cfg.task, "target_lang",
                                                                        None)
        if not source or not target:
            return
        files = {"encoder": f"dict.{source}.txt", "decoder": f"dict.{target}.txt"}
        model = f"translation model ({source}-{target})"
    needed = ", ".join(files.values())
    for side, name in files.items():
        path = os.path.join(data, name)
        if not os.path.isfile(path):
            raise option_error("DATA_DIR", data, f"has no {name}, which this {model} needs: not "
                               "its data-bin", f"the data-bin the model was trained on ({needed})")
        weights = state.get("model") or {}
        table = next((weights[k] for k in (f"{side}.embed_tokens.weight",
                                            f"{side}.embed_tokens.table.weight") if k in weights),
                     None)
        if table is None or table.dim() != 2:
            continue
        size = len(Dictionary.load(path))
        if size != table.size(0):
            raise option_error("DATA_DIR", data, f"its {name} gives {size:,} symbols where the "
                               f"checkpoint's {side} embedding has {table.size(0):,} rows: not "
                               "the dictionary the model was trained with", "the data-bin the "
                               f"model was trained on (the {name} it was binarized with)")


class Reader:
    """The parameters of ``model`` by state-dict name, in float32; records what was read."""

    def __init__(self, model):
        self.model = model
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.used = set()

    def has(self, name):
        return name in self.params

    def take(self, name):
        if name not in self.params:
            raise KeyError(f"{name}: not a parameter of the model; allowed: one of its "
                           "state-dict names")
        self.used.add(name)
        return self.params[name].detach().float().clone()

    def module(self, name):
        return self.model.get_submodule(name)

    def linear(self, name):
        """``(weight, bias or None)`` of the linear layer ``name``; a LoRA layer folded."""
        module = self.module(name)
        weight = self.take(f"{name}.weight")
        bias = self.take(f"{name}.bias") if self.has(f"{name}.bias") else None
        if self.has(f"{name}.lora_A"):
            down, up = self.take(f"{name}.lora_A"), self.take(f"{name}.lora_B")
            weight = weight + module.scaling * (up @ down)
        return weight, bias

    def norm(self, name):
        """``(weight, bias or None, eps)`` of a LayerNorm or RMSNorm."""
        module = self.module(name)
        weight = self.take(f"{name}.weight")
        bias = self.take(f"{name}.bias") if self.has(f"{name}.bias") else None
        return weight, bias, float(module.eps)

    def left(self):
        return [name for name in self.params if name not in self.used]


@dataclasses.dataclass
class InputEmbedding:
    """What one side's input embedding holds, for the plugin's and fairseq's layouts alike."""

    table: str              # parameter name of the token table
    scale: float            # sqrt(d), or 1 with --no-scale-embedding
    positions: str          # "sinusoidal", "learned" or "none"
    positions_table: str    # parameter name of a learned table ("" otherwise)
    project_in: str         # parameter name of the projection of a narrower table ("" if none)
    max_positions: int
    padding_idx: int


def input_embedding(model, side):
    """:class:`InputEmbedding` of ``model.<side>``: the plugin keeps table, positions and input
    projection inside ``embed_tokens``; fairseq's own models on the side itself."""
    from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
    from slim_fairseq.modules.input_embedding import StandardInputEmbedding
    stack = getattr(model, side)
    embed = stack.embed_tokens
    if isinstance(embed, StandardInputEmbedding):
        prefix, holder, table = f"{side}.embed_tokens.", embed, f"{side}.embed_tokens.table.weight"
        scale = embed.embed_scale
    elif type(embed) is nn.Embedding:
        prefix, holder, table = f"{side}.", stack, f"{side}.embed_tokens.weight"
        scale = stack.embed_scale
    else:
        return None
    positions = holder.embed_positions
    kind = ("none" if positions is None else "learned"
            if isinstance(positions, LearnedPositionalEmbedding) else "sinusoidal"
            if isinstance(positions, SinusoidalPositionalEmbedding) else type(positions).__name__)
    project = getattr(holder, "project_in_dim", None)
    return InputEmbedding(
        table=table, scale=float(scale), positions=kind,
        positions_table=f"{prefix}embed_positions.weight" if kind == "learned" else "",
        project_in=f"{prefix}project_in_dim.weight" if project is not None else "",
        max_positions=int(stack.max_positions()), padding_idx=int(embed.padding_idx))


def sinusoid_table(rows, dim, padding_idx):
    """fairseq's sinusoidal position table (``SinusoidalPositionalEmbedding.get_embedding``):
    row ``padding_idx + 1 + p`` holds position p."""
    from fairseq.modules import SinusoidalPositionalEmbedding
    return SinusoidalPositionalEmbedding.get_embedding(rows, dim, padding_idx).float()


def is_scaled(embedding: InputEmbedding, width):
    """Whether the token table is multiplied by sqrt(width) (fairseq's default)."""
    return math.isclose(embedding.scale, math.sqrt(width)) and embedding.scale != 1.0


def activation_name(args, glu=False):
    """The transformers name (``ACT2FN``) of the model's activation: fairseq's gelu is the exact
    one, its gelu_accurate the tanh form (gelu_new), swish and silu one function."""
    name = getattr(args, "activation_fn", None) or "relu"
    names = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new",
             "silu": "silu", "swish": "silu", "tanh": "tanh", "linear": "linear",
             "relu_squared": "relu2"}
    if glu:
        names = {k: v for k, v in names.items() if k in ("relu", "gelu", "silu")}
    if name not in names:
        raise option_error("--activation-fn", name, "has no transformers counterpart here",
                           alternatives=[{"--activation-fn": n} for n in names])
    return names[name]
