"""Checks of a ``fairseq-train`` run, made right after fairseq parsed its command line (the
architecture preset is the first code of the plugin fairseq calls, before it reads any data or
starts a worker): what fairseq itself would only find later, with a traceback.

* mixed precision (``--fp16``, ``--bf16``, ``--memory-efficient-fp16``) or several workers on a
  machine where torch sees no CUDA GPU;
* a data-bin of the other kind (language-model data for ``--task translation``, translation data
  for ``--task language_modeling``: fairseq stops at a missing ``dict.txt``), without the splits
  the run reads, or with an empty one (an empty training file binarizes to an empty ``.bin``,
  which fairseq cannot map), a truncated ``.bin``, a validation sample longer than
  ``--max-tokens``, two dictionaries with ``--share-all-embeddings``;
* values that cannot train (a learning rate <= 0, limits below 0, ``--tokens-per-sample 0``);
* a save-dir that is a file, lies under one or cannot be written.

Then the run takes its save-dir for itself (:mod:`slim_fairseq.save_dir_lock`).

:func:`check_data_bin`, :func:`check_values`, :func:`check_data_files` and :func:`check_save_dir`
are also what the train recipes of examples/ check (slim_fairseq_lab.recipes).
"""
import glob
import os

from slim_fairseq.option_errors import option_error, prog_name

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


# a parser's default that marks the namespaces it parses (:func:`mark_command_line`)
COMMAND_LINE = "slim_fairseq_command_line"


def mark_command_line(parser):
    """Mark the namespaces ``parser`` parses as a command line's. fairseq calls a model's
    ``add_args`` only while it parses a command line (``options.parse_args_and_arch``), then the
    architecture function on the namespace it parsed; a model built from a checkpoint's saved
    options gets no mark."""
    parser.set_defaults(**{COMMAND_LINE: True})


def take_command_line_mark(args):
    """Whether fairseq parsed ``args`` from a command line (:func:`mark_command_line`); the mark
    is taken off, so it is read once and is never saved in a checkpoint."""
    marked = getattr(args, COMMAND_LINE, None) is True
    if marked:
        delattr(args, COMMAND_LINE)
    return marked


def check_command_line(args):
    """The checks of this module, for a command line of ``fairseq-train`` (the running program,
    as its error lines name it) that fairseq parsed into ``args``."""
    if prog_name() == "fairseq-train":
        check_devices(args)
        check_data_bin(getattr(args, "data", None), getattr(args, "task", None),
                       getattr(args, "train_subset", "train"), _valid_subsets(args))
        check_values(args)
        check_data_files(args)
        check_save_dir(getattr(args, "save_dir", None))
        from slim_fairseq import save_dir_lock
        save_dir_lock.take_for_training(args)


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


# ---------------------------------------------------------------------------------------------
# values that cannot train, the data-bin's index, the save-dir

# numpy dtypes of fairseq's mmap index codes (fairseq/data/indexed_dataset.py, _code_to_dtype)
INDEX_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float64",
                8: "uint16", 9: "uint32", 10: "uint64"}


def read_mmap_index(path):
    """``(dtype, count, sizes, pointers)`` of a fairseq mmap index file: the items' numpy dtype
    (None for a code fairseq does not write), the number of items its header says, their sizes
    and their byte offsets in the ``.bin`` (shorter than ``count`` in a truncated file); None for
    another layout."""
    import struct

    import numpy as np
    with open(path, "rb") as f:
        if f.read(9) != b"MMIDIDX\x00\x00":
            return None
        f.read(8)
        (code,) = struct.unpack("<B", f.read(1))
        (count,) = struct.unpack("<Q", f.read(8))
        sizes = np.fromfile(f, dtype=np.int32, count=count)
        pointers = np.fromfile(f, dtype=np.int64, count=count)
    return INDEX_DTYPES.get(code), count, sizes, pointers


def read_index(path):
    """``(sizes, bin_bytes)`` of a fairseq mmap index file: the item sizes and the bytes its
    ``.bin`` must hold; ``(None, None)`` for another layout (fairseq reads those itself)."""
    import numpy as np
    index = read_mmap_index(path)
    if index is None:
        return None, None
    dtype, count, sizes, pointers = index
    if len(sizes) < count or len(pointers) < count or dtype is None:
        return sizes, None
    end = int(pointers[-1]) + int(sizes[-1]) * np.dtype(dtype).itemsize if count else 0
    return sizes, end


def check_values(args):
    """Values with which fairseq-train cannot train: a learning rate <= 0, a
    ``--max-update`` / ``--max-epoch`` below 0 (0 is fairseq's "no limit" for both), an update
    frequency, ``--batch-size`` or ``--tokens-per-sample`` < 1."""
    for lr in getattr(args, "lr", None) or ():
        if lr <= 0:
            raise option_error("--lr", _number(args.lr), "a learning rate must be > 0 (the updates would "
                               "not move, or move away from the minimum)", "--lr N, N > 0 (e.g. 0.0005)")
    for flag, effect in (("--max-update", "stops after the first update"), ("--max-epoch", "trains no epoch")):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and value < 0:
            raise option_error(flag, value, f"a limit below 0, with which fairseq {effect}",
                               f"{flag} N, N >= 1, or {flag} 0 (no limit)")
    freq = getattr(args, "update_freq", None) or ()
    if any(f < 1 for f in freq):
        raise option_error("--update-freq", _number(freq), "not a whole number >= 1", "--update-freq 1")
    batch = getattr(args, "batch_size", None)
    if batch is not None and batch < 1:
        raise option_error("--batch-size", batch, "not a whole number >= 1 (no sentence per batch)",
                           "--batch-size N, N >= 1")
    if getattr(args, "task", None) == "language_modeling":
        tokens = getattr(args, "tokens_per_sample", None)
        if tokens is not None and tokens < 1:
            raise option_error("--tokens-per-sample", tokens, "a sample holds at least one token",
                               "--tokens-per-sample N, N >= 1")


def _number(values):
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def check_data_files(args, name="DATA"):
    """The binarized splits the run reads are whole (a ``.bin`` as long as its ``.idx`` says),
    the batches can hold the samples, and ``--share-all-embeddings`` has one dictionary for both
    languages.

    fairseq skips training samples longer than ``--max-tokens`` (with a warning), and stops with
    a traceback when none is left; a validation sample longer than ``--max-tokens-valid`` (by
    default ``--max-tokens``) stops it with a traceback whatever
    ``--skip-invalid-size-inputs-valid-test`` says (that option drops samples longer than the
    model's positions only)."""
    data, task = getattr(args, "data", None), getattr(args, "task", None)
    if not data or task not in ("translation", "language_modeling"):
        return
    folder = data.split(":")[0]
    train, valid = getattr(args, "train_subset", "train"), _valid_subsets(args)
    longest_valid, shortest_train = None, None
    for subset in [train, *valid]:
        for index in split_files(folder, subset):
            sizes, end = read_index(index)
            binary = index[:-len(".idx")] + ".bin"
            if end is not None and os.path.isfile(binary) and os.path.getsize(binary) < end:
                raise option_error(f"{name}={data}", None, f"{os.path.basename(binary)} holds "
                                   f"{os.path.getsize(binary)} bytes, and {os.path.basename(index)} describes "
                                   f"{end} (a truncated file)", "the data-bin binarized again (fairseq-preprocess)")
            if sizes is None or not len(sizes):
                continue
            longest, shortest = _sample_sizes(args, sizes)
            if subset in valid:
                longest_valid = max(longest_valid or 0, longest)
            if subset == train:
                shortest_train = max(shortest_train or 0, shortest)  # the shortest of the longest side
    max_tokens, max_valid = (_whole(getattr(args, key, None)) for key in ("max_tokens", "max_tokens_valid"))
    if max_tokens is not None and shortest_train is not None and max_tokens < shortest_train:
        raise option_error("--max-tokens", max_tokens, f"every training sample is longer (the shortest holds "
                           f"{shortest_train} tokens), and fairseq skips those", f"--max-tokens N, N >= {shortest_train}")
    if max_valid is not None and longest_valid is not None and max_valid < longest_valid:
        flag = "--max-tokens" if max_valid == max_tokens else "--max-tokens-valid"
        raise option_error(flag, max_valid, f"the validation data holds a sample of {longest_valid} tokens, which "
                           "no validation batch could hold", f"{flag} N, N >= {longest_valid}"
                           + (f", or --max-tokens-valid {longest_valid}" if flag == "--max-tokens" else ""))
    if task == "translation" and getattr(args, "share_all_embeddings", False):
        check_joined_dictionary(folder, getattr(args, "source_lang", None), getattr(args, "target_lang", None),
                                name, data)


def _whole(value):
    """An option's whole number (fairseq leaves some as the text given), None when unset."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _sample_sizes(args, sizes):
    """(longest, shortest) sample fairseq makes of a split whose lines have ``sizes`` tokens:
    lines, or for language modelling with ``--sample-break-mode none`` blocks of
    ``--tokens-per-sample`` (the complete modes pack lines: their lines bound the blocks from
    below)."""
    if getattr(args, "task", None) == "language_modeling" and getattr(args, "sample_break_mode", "none") == "none":
        block = min(int(getattr(args, "tokens_per_sample", 0) or sizes.sum()), int(sizes.sum()))
        return block, block
    return int(sizes.max()), int(sizes.min())


def _symbols(path):
    with open(path, encoding="utf-8") as f:
        return [line.split(" ", 1)[0].rstrip("\n") for line in f]


def check_joined_dictionary(folder, src, tgt, name, data):
    """``--share-all-embeddings`` needs one dictionary for both sides (fairseq-preprocess
    ``--joined-dictionary``)."""
    if not (src and tgt):
        for entry in sorted(os.listdir(folder)):
            parts = entry.split(".")
            if len(parts) >= 3 and len(parts[1].split("-")) == 2:
                src, tgt = parts[1].split("-")
                break
    paths = [os.path.join(folder, f"dict.{lang}.txt") for lang in (src, tgt)]
    if not (src and tgt) or not all(os.path.isfile(p) for p in paths):
        return
    first, second = (_symbols(p) for p in paths)
    if first == second:
        return
    if len(first) != len(second):
        differ = f"{len(first)} and {len(second)} entries"
    else:
        line = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b) + 1
        differ = f"line {line}: '{first[line - 1]}' and '{second[line - 1]}'"
    raise option_error("--share-all-embeddings", None, f"one embedding table for both languages needs one "
                       f"dictionary, and {name}={data} has two (dict.{src}.txt and dict.{tgt}.txt: {differ})",
                       "a data-bin of fairseq-preprocess --joined-dictionary, or an arch and options without "
                       "--share-all-embeddings")


def check_save_dir(save_dir, name="--save-dir"):
    """A save-dir the run can create and write: not a file, not under a file, writable."""
    if not save_dir:
        return
    path = os.path.abspath(save_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise option_error(name, save_dir, "a file, and the checkpoints need a folder",
                           f"a --save-dir that is a folder or does not exist yet")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise option_error(name, save_dir, f"lies under {existing}, which is a file",
                           "a --save-dir that is a folder or does not exist yet")
    if not os.access(existing, os.W_OK | os.X_OK) or not _writable(existing):
        where = "" if existing == path else f" ({existing} cannot be written)"
        raise option_error(name, save_dir, f"cannot be written{where}", "a --save-dir in a folder you can write")


def _writable(folder):
    """``os.access`` says yes to root on a read-only mode: try a file there (removed at once)."""
    import tempfile
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False
