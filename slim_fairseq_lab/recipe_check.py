"""What a training recipe (examples/*/train-*.sh) checks before it starts fairseq-train: the
whole command line it built, read by fairseq-train's own parser with the plugin loaded, and the
data-bin it names. Each problem is one line, ``PROGRAM: error: ...``, and exit status 2:

* an ``--arch`` fairseq does not know (with the closest names), an option fairseq-train does not
  take for that architecture and task, a value its parser refuses, and every option the plugin
  refuses (fairseq's 200-line usage, or a traceback, otherwise);
* a DATA_BIN without the dictionaries, the training split or the validation split of the task
  (fairseq stops with a traceback when it reaches them), and language-model data given to a
  translation recipe or the reverse.

``python -m slim_fairseq_lab.recipe_check [--parse-only] PROGRAM -- FAIRSEQ_TRAIN_ARGS...``
(``--parse-only``: the command line only, for a dry run before the data exist)
"""
import glob
import os
import sys


class RecipeCheckError(Exception):
    """What is wrong, one line."""


def _splits(data, name):
    """The binarized files of split ``name`` in ``data``: ``name.idx`` (language modelling) or
    ``name.SRC-TGT.LANG.idx`` (translation), numbered shards ``name1`` ... included."""
    return glob.glob(os.path.join(data, f"{name}.idx")) + \
        glob.glob(os.path.join(data, f"{name}.*-*.*.idx")) + \
        glob.glob(os.path.join(data, f"{name}[0-9]*.idx"))


def check_data(args):
    """The data-bin of ``args`` (fairseq-train's parse) holds what its task reads."""
    data = args.data.split(":")[0]
    if not os.path.isdir(data):
        raise RecipeCheckError(f"DATA_BIN={args.data}: not a folder; allowed: the data-bin a "
                               "prepare script (or fairseq-preprocess) wrote")
    lm_dict = os.path.isfile(os.path.join(data, "dict.txt"))
    pair_dicts = [f for f in os.listdir(data) if f.startswith("dict.") and f != "dict.txt"
                  and f.endswith(".txt")]
    task = args.task
    if task == "translation" and lm_dict and not pair_dicts:
        raise RecipeCheckError(f"DATA_BIN={args.data}: language-model data (dict.txt, no language "
                               "pair), and this recipe trains a translation model; allowed: a "
                               "translation data-bin (examples/translation/prepare-*.sh), or a "
                               "language-model recipe (examples/lm/train-*.sh)")
    if task == "language_modeling" and pair_dicts and not lm_dict:
        raise RecipeCheckError(f"DATA_BIN={args.data}: translation data ({', '.join(sorted(pair_dicts))}), "
                               "and this recipe trains a language model; allowed: a "
                               "language-model data-bin (fairseq-preprocess --only-source, "
                               "examples/lm/prepare-wikitext-103.sh), or a translation recipe "
                               "(examples/translation/train-*.sh)")
    if task == "language_modeling" and not lm_dict:
        raise RecipeCheckError(f"DATA_BIN={args.data}: no dict.txt; allowed: a data-bin written "
                               "by fairseq-preprocess --only-source")
    if task == "translation" and not pair_dicts:
        raise RecipeCheckError(f"DATA_BIN={args.data}: no dictionaries (dict.LANG.txt); allowed: a "
                               "data-bin written by a prepare script or fairseq-preprocess")
    for option, subsets in (("--train-subset", [args.train_subset]),
                            ("--valid-subset", [] if args.disable_validation
                             else args.valid_subset.split(","))):
        for subset in subsets:
            if not _splits(data, subset):
                fix = ("a data-bin binarized with --validpref, or --disable-validation"
                       if option == "--valid-subset" else "a data-bin binarized with --trainpref")
                raise RecipeCheckError(f"DATA_BIN={args.data}: no {subset} split ({subset}*.idx; "
                                       f"{option} {subset}); allowed: {fix}")


def parse_train_argv(argv):
    """fairseq-train's parse of ``argv`` with the plugin of its --user-dir loaded; every refusal
    as a :class:`RecipeCheckError`."""
    import argparse

    from fairseq import options, utils

    user_dir = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--user-dir"), None)
    if user_dir:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))
    from fairseq.models import ARCH_MODEL_REGISTRY
    from slim_fairseq.option_errors import unknown_arch
    arch = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--arch", "-a")), None)
    if arch is not None and arch not in ARCH_MODEL_REGISTRY:
        raise RecipeCheckError(str(unknown_arch(arch)))
    parser = options.get_training_parser()

    def error(message):
        if message.startswith("unrecognized arguments: "):
            flags = message.split(": ", 1)[1]
            message = (f"{flags}: not options of fairseq-train with --arch {arch}"
                       + (f" --task {args_task(argv)}" if args_task(argv) else "")
                       + "; allowed: the options of fairseq-train --help and slim-fairseq-help "
                       + (arch or "ARCH"))
        raise RecipeCheckError(message)

    parser.error = error
    try:
        return options.parse_args_and_arch(parser, input_args=argv)
    except SystemExit as exit_:  # the plugin's one-line option errors are SystemExits too
        code = exit_.code if isinstance(exit_.code, str) else str(exit_)
        raise RecipeCheckError(code.split(": error: ", 1)[-1]) from None


def args_task(argv):
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--task"), None)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parse_only = argv[:1] == ["--parse-only"]
    program, argv = argv[int(parse_only)], argv[argv.index("--") + 1:]
    try:
        args = parse_train_argv(argv)
        if not parse_only:
            check_data(args)
    except RecipeCheckError as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
