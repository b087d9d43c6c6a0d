"""Checks of a ``fairseq-train`` run, made right after fairseq parsed its command line (the
architecture preset is the first code of the plugin fairseq calls, before it reads any data or
starts a worker): what fairseq itself would only find later, with a traceback.

* mixed precision (``--fp16``, ``--bf16``, ``--memory-efficient-fp16``) or several workers on a
  machine where torch sees no CUDA GPU;
* a data-bin of the other kind (language-model data for ``--task translation``, translation data
  for ``--task language_modeling``: fairseq stops at a missing ``dict.txt``), without the splits
  the run reads, or with an empty one (an empty training file binarizes to an empty ``.bin``,
  which fairseq cannot map).

:func:`check_data_bin` is also what the train recipes of examples/ check (slim_fairseq_lab.recipes).
"""
import glob
import os
import sys

from slim_fairseq.option_errors import option_error

RECIPE_FIXES = {
    "translation": "a translation data-bin (examples/translation/prepare-*.sh), or a language-model "
                   "recipe (examples/lm/train-*.sh)",
    "language_modeling": "a language-model data-bin (fairseq-preprocess --only-source, "
                         "examples/lm/prepare-wikitext-103.sh), or a translation recipe "
                         "(examples/translation/train-*.sh)",
}
TOOL_FIXES = {
    "translation": "a translation data-bin (fairseq-preprocess --source-lang S --target-lang T), or "
                   "--task language_modeling with a language-model arch",
    "language_modeling": "a language-model data-bin (fairseq-preprocess --only-source), or --task "
                         "translation with an encoder-decoder arch",
}


def _in_frames(test):
    frame = sys._getframe(1)
    while frame is not None:
        if test(frame):
            return True
        frame = frame.f_back
    return False


def parsing_command_line():
    """Whether fairseq is parsing a command line now (``options.parse_args_and_arch``), not
    building a model from a checkpoint's saved options."""
    return _in_frames(lambda frame: frame.f_code.co_name == "parse_args_and_arch"
                      and frame.f_globals.get("__name__") == "fairseq.options")


def in_tool(name):
    """Whether the process runs fairseq's command-line tool ``name`` (``fairseq_cli.NAME``)."""
    return _in_frames(lambda frame: frame.f_globals.get("__name__") == f"fairseq_cli.{name}")


def check_command_line(args):
    """The checks of this module, when ``fairseq-train`` parses its command line."""
    if parsing_command_line() and in_tool("train"):
        check_devices(args)
        check_data_bin(getattr(args, "data", None), getattr(args, "task", None),
                       getattr(args, "train_subset", "train"), _valid_subsets(args))


def _valid_subsets(args):
    if getattr(args, "disable_validation", False):
        return ()
    return tuple(s for s in (getattr(args, "valid_subset", "valid") or "").split(",") if s)


def check_devices(args):
    """Mixed precision and several workers need CUDA GPUs, which torch must see."""
    import torch
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible:
        return
    for dest in ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16"):
        if getattr(args, dest, False):
            flag = "--" + dest.replace("_", "-")
            raise option_error(flag, None, "mixed precision runs on CUDA GPUs, and torch sees none here",
                         f"drop {flag} (float32 on the CPU)")
    world = getattr(args, "distributed_world_size", 1) or 1
    if world > 1 and not getattr(args, "cpu", False) and not getattr(args, "tpu", False):
        raise option_error("--distributed-world-size", world, "one worker per CUDA GPU, and torch sees "
                     "none here", "--distributed-world-size 1")


def split_files(data, subset):
    """The binarized files of split ``subset`` in ``data``: ``subset.idx`` (language modelling)
    or ``subset.SRC-TGT.LANG.idx`` (translation), numbered shards ``subset1`` ... included."""
    return sorted(glob.glob(os.path.join(data, f"{subset}.idx"))
                  + glob.glob(os.path.join(data, f"{subset}.*-*.*.idx"))
                  + glob.glob(os.path.join(data, f"{subset}[0-9]*.idx")))


def check_data_bin(data, task, train_subset="train", valid_subsets=("valid",), name="DATA",
                   recipe=False):
    """The data-bin ``data`` holds what ``task`` reads: its dictionaries, the training split and
    the validation splits, none of them empty. ``name``: how the data-bin is named in the
    errors (``DATA_BIN`` in the recipes, whose advice then names the recipes)."""
    if not data or task not in ("translation", "language_modeling"):
        return
    folder = data.split(":")[0]
    if not os.path.isdir(folder):
        raise option_error(f"{name}={data}", None, "not a folder", "the data-bin a prepare script (or "
                     "fairseq-preprocess) wrote")
    fixes = RECIPE_FIXES if recipe else TOOL_FIXES
    lm_dict = os.path.isfile(os.path.join(folder, "dict.txt"))
    pair_dicts = sorted(f for f in os.listdir(folder) if f.startswith("dict.") and f != "dict.txt"
                        and f.endswith(".txt"))
    if task == "translation" and lm_dict and not pair_dicts:
        doing = "this recipe trains a translation model" if recipe else "--task translation reads a language pair"
        raise option_error(f"{name}={data}", None, f"language-model data (dict.txt, no language pair), and {doing}",
                     fixes[task])
    if task == "language_modeling" and pair_dicts and not lm_dict:
        doing = "this recipe trains a language model" if recipe else "--task language_modeling reads dict.txt"
        raise option_error(f"{name}={data}", None, f"translation data ({', '.join(pair_dicts)}), and {doing}", fixes[task])
    if task == "language_modeling" and not lm_dict:
        raise option_error(f"{name}={data}", None, "no dict.txt", "a data-bin written by fairseq-preprocess --only-source")
    if task == "translation" and not pair_dicts:
        raise option_error(f"{name}={data}", None, "no dictionaries (dict.LANG.txt)", "a data-bin written by a "
                     "prepare script or fairseq-preprocess")
    for option, subsets in (("--train-subset", [train_subset]), ("--valid-subset", list(valid_subsets))):
        for subset in subsets:
            files = split_files(folder, subset)
            if not files:
                fix = ("a data-bin binarized with --validpref, or --disable-validation"
                       if option == "--valid-subset" else "a data-bin binarized with --trainpref")
                raise option_error(f"{name}={data}", None, f"no {subset} split ({subset}*.idx; {option} {subset})", fix)
            bins = [f[:-len(".idx")] + ".bin" for f in files]
            empty = [b for b in bins if os.path.isfile(b) and os.path.getsize(b) == 0]
            if empty:
                pref = "--trainpref" if option == "--train-subset" else "--validpref"
                raise option_error(f"{name}={data}", None, f"its {subset} split is empty ({os.path.basename(empty[0])} "
                             "holds no tokens: an empty text file was binarized)",
                             f"a data-bin binarized from a {pref} text that has lines")
