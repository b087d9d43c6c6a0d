"""Checkpoints written by slim_fairseq 0.1.0 load into today's models and give the same outputs
(docs/DESIGN.md, "Checkpoints of earlier versions"; the fixtures under tests/fixtures/).

Version 0.1.0 had three LM classes (``slim_lm``, ``stlm_lm``, ``skipless_lm``) with their own
option names and layer layouts; today the ``stlm_*`` and ``skipless_lm*`` architectures are
presets of ``slim_lm``. Two steps, in fairseq's own places:

* :func:`upgrade_args`, on the stored options before the architecture preset fills the rest
  (the plugin's preset wrapper runs it; fairseq calls the preset when it builds a model from a
  checkpoint): options that were renamed take their new names;
* :func:`upgrade_state_dict`, from the model's ``upgrade_state_dict_named`` (fairseq calls it
  before ``load_state_dict``): parameters of the earlier layouts take their new names.
"""
import re

import torch

# 0.1.0 option -> how it reads today
_TIE_OFF = ("-1", "off", "")


def _delete(args, name):
    try:
        delattr(args, name)
    except (AttributeError, KeyError):
        pass


def upgrade_args(args):
    """Rename the options of 0.1.0 in ``args`` (a Namespace or fairseq's DictConfig) in place;
    options written today are left alone."""
    if hasattr(args, "glu_activation"):  # --glu-activation -> --activation-fn under --ffn-glu
        if getattr(args, "ffn_glu", False):
            args.activation_fn = args.glu_activation
        _delete(args, "glu_activation")
    if hasattr(args, "untie_embeddings"):  # stlm_lm: tied unless --untie-embeddings
        args.share_decoder_input_output_embed = not args.untie_embeddings
        _delete(args, "untie_embeddings")
    if hasattr(args, "ffn_type"):  # skipless_lm: --ffn-type glu had a hidden width of F
        args.ffn_glu = args.ffn_type == "glu"
        if args.ffn_glu:
            args.glu_hidden = "full"
        _delete(args, "ffn_type")
    if hasattr(args, "ffn_activation"):
        args.activation_fn = args.ffn_activation
        _delete(args, "ffn_activation")
    if hasattr(args, "embed_layernorm"):
        args.layernorm_embedding = bool(args.embed_layernorm)
        _delete(args, "embed_layernorm")
    if hasattr(args, "_name"):  # a stored config (a command line has no _name): -1 / off meant off
        for name in ("tie_ffn", "tie_attn_proj"):
            if str(getattr(args, name, "none")).strip().lower() in _TIE_OFF:
                setattr(args, name, "none")
    return args


# (pattern, replacement) on parameter names of 0.1.0's stlm_lm and skipless_lm decoders
_LAYER_RENAMES = (
    (r"\.attn_norm\.", ".self_attn_layer_norm."),
    (r"\.ffn_norm\.", ".final_layer_norm."),
    (r"\.ffn\.w1\.", ".fc1.w1."),
    (r"\.ffn\.w3\.", ".fc1.w3."),
    (r"\.ffn\.w2\.", ".fc2."),
    (r"\.ffn\.fc_gate\.", ".fc1.w1."),  # skipless GLU: act(fc_gate x) * fc1 x
    (r"\.ffn\.fc2\.", ".fc2."),
)


def upgrade_state_dict(state_dict, name="", tied=False):
    """Rename the parameters of a 0.1.0 ``stlm_lm`` / ``skipless_lm`` checkpoint in place
    (``name``: the model's prefix in ``state_dict``, usually empty; ``tied``: the model ties
    its output projection to the token table). Today's layouts have no
    ``decoder.embed_tokens.weight`` (the table sits in the input embedding) and pass unchanged."""
    prefix = f"{name}." if name else ""
    decoder = f"{prefix}decoder."
    old_table = f"{decoder}embed_tokens.weight"
    if old_table not in state_dict:
        return state_dict
    glu_layers = {key.split(".ffn.fc_gate.")[0] for key in state_dict if ".ffn.fc_gate." in key}
    for key in list(state_dict):
        new = key
        if key == old_table:
            new = f"{decoder}embed_tokens.table.weight"
        elif key.startswith(f"{decoder}embed_layernorm."):
            new = key.replace("embed_layernorm.", "layernorm_embedding.", 1)
        elif key.startswith(f"{decoder}layers."):
            layer = key.split(".ffn.")[0]
            if ".ffn.fc1." in key:
                new = key.replace(".ffn.fc1.", ".fc1.w3." if layer in glu_layers else ".fc1.")
            for pattern, replacement in _LAYER_RENAMES:
                new = re.sub(pattern, replacement, new)
        if new != key:
            state_dict[new] = state_dict.pop(key)
    # fairseq's decoder drops its final norm for checkpoints without a version (written before
    # fairseq normalised after the stack); these decoders had none to record
    state_dict[f"{decoder}version"] = torch.Tensor([3])
    projection = f"{decoder}output_projection.weight"
    if projection not in state_dict and tied:
        state_dict[projection] = state_dict[f"{decoder}embed_tokens.table.weight"]
    return state_dict
