"""The launcher of the train recipes (examples/*/train-*.sh): a recipe is a :class:`TrainRecipe`
(its arch, task, hyperparameters, batch and paper setting) and :func:`main` its command line.

Options the recipe does not know pass on to ``fairseq-train`` after the recipe's own, so they
win. The launch:

* 1 GPU / CPU: ``fairseq-train ... --distributed-world-size 1``;
* N GPUs on one node: ``fairseq-train ... --distributed-world-size N`` (fairseq spawns N workers);
* several nodes: ``torchrun --nnodes M --node-rank R --nproc-per-node N ...`` (default), or
  ``fairseq-train ... --distributed-init-method tcp://HOST:PORT --distributed-world-size M*N
  --distributed-rank R*N`` (``--init-method``).

The world size is always passed: fairseq's own default is every visible GPU, which would multiply
the batch the update frequency was computed for. The options that decide the batch
(``--max-tokens``, ``--batch-size``, ``--update-freq``) are read by the launcher, so that the batch
it prints is the one fairseq gets.

Before anything is written (the save-dir, its ``recipe.data``), the whole ``fairseq-train``
command line is read once by fairseq's own parser with the plugin loaded, and the data-bin, the
GPUs and the save-dir are checked; each problem is one line. ``recipe.data`` records the data-bin
of a run: fairseq resumes from the save-dir's ``checkpoint_last.pt``, and the default save-dir is
per architecture, not per dataset. A run that fails before it saved a checkpoint leaves the
save-dir as it found it.
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import shutil

from slim_fairseq_lab import checkpoints
from slim_fairseq_lab.recipes import cli, tools
from slim_fairseq_lab.recipes.cli import OptionError, refuse

TRAIN_USAGE = '''options of every train script (--name=VALUE is the same as --name VALUE):
  DATA_BIN                  binarized data (first argument)
  --arch ARCH               architecture preset (default: the script's)
  --save-dir DIR            checkpoints (default: checkpoints/ARCH); refused if it holds a
                            run on another DATA_BIN (noted in DIR/recipe.data)
  --paper                   the paper's training setting where it differs from the default
                            (see the header above)
  --gpus N                  GPUs per node (default: all visible; 0 = CPU; --cpu = --gpus 0)
  --nodes M --node-rank R   multi-node training (run the same command on every node)
  --master-addr HOST --master-port PORT   rendezvous of torchrun (default 127.0.0.1:29500)
  --init-method URL         use fairseq's own spawning with this init method instead of torchrun
                            (--distributed-init-method is the same option)
  --fp16                    mixed precision on CUDA GPUs (--bf16 is refused: fairseq 0.12.3
                            trains bf16 on TPUs only; fairseq-train's --amp passes on)
  --max-tokens N            tokens per GPU batch (the update frequency keeps the recipe's batch)
  --batch-size N            sentences per GPU batch: an upper bound on top of --max-tokens; with
                            --paper it replaces the paper's sentence batch (fairseq's
                            --max-sentences is the same option)
  --update-freq N           fixed update frequency instead of the derived one
  --cpu-smoke               2 updates of a tiny copy of the architecture on CPU (tests)
  --dry-run                 print the command only
  other options             passed on to fairseq-train (they override the recipe's); the
                            world size and the rank are the launcher's (refused here)
Before training, the effective batch per update (max tokens or sentences x update frequency x
workers) is printed.
'''

# what --cpu-smoke adds: 2 updates of a tiny model of the same kind (the model class's own
# shrinking overrides are appended when it runs); batch options given on the command line win
SMOKE = ("--cpu", "--max-update", "2", "--max-tokens", "256", "--update-freq", "1", "--num-workers", "0",
         "--save-interval-updates", "1", "--keep-interval-updates", "3", "--log-format", "simple",
         "--log-interval", "1")


@dataclasses.dataclass(frozen=True)
class TrainRecipe:
    """One train recipe. ``tokens_per_update``: the batch the update frequency keeps (0: none,
    update frequency 1). The paper setting (``--paper``): ``paper_args`` (fairseq-train options),
    ``paper_sentences`` (its batch in ``paper_unit`` per update; 0: the recipe's token batch),
    ``paper_gpus`` (its GPU count when --gpus is not given; None: every GPU), ``paper_hardware``
    (in words), ``paper_precision`` (``--fp16`` when it trained in mixed precision),
    ``paper_notes`` (what --paper does not reproduce), ``paper_none`` (why there is no paper
    setting: --paper is refused)."""
    prog: str
    doc: str
    arch: str
    max_tokens: int
    tokens_per_update: int
    task_args: tuple
    hparams: tuple
    smoke_args: tuple = ()
    paper_args: tuple = ()
    paper_sentences: int = 0
    paper_unit: str = "sentences"
    paper_gpus: int = None
    paper_hardware: str = ""
    paper_precision: str = ""
    paper_notes: tuple = ()
    paper_none: str = ""

    @property
    def task(self):
        return self.task_args[self.task_args.index("--task") + 1]

    @property
    def help(self):
        return self.doc.lstrip("\n") + "\n" + TRAIN_USAGE


def gpu_count():
    """The CUDA devices torch sees (0 without CUDA)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parser(recipe):
    p = cli.Parser(recipe.prog)
    p.value("--arch", default=recipe.arch)
    p.value("--save-dir")
    p.value("--gpus", kind="whole")
    p.flag("--cpu", dest="gpus", const="0")
    p.value("--nodes", kind="count", default="1")
    p.value("--node-rank", kind="whole", default="0")
    p.value("--master-addr", default="127.0.0.1")
    p.value("--master-port", kind="count", default="29500")
    p.value("--init-method", "--distributed-init-method", dest="init_method")
    p.value("--max-tokens", kind="count")
    p.value("--batch-size", "--max-sentences", kind="count", dest="batch_size")
    p.value("--update-freq", kind="count")
    p.refused("--distributed-world-size", "set by the recipe from --gpus and --nodes",
              "--gpus N (per node) and --nodes N")
    p.refused("--distributed-rank", "set by the recipe from --node-rank and --gpus",
              "--node-rank N")
    p.flag("--paper", default=False)
    p.flag("--fp16", dest="precision", const="--fp16")
    p.refused("--bf16", "fairseq 0.12.3 trains bf16 on TPUs only (its --bf16 implies --tpu)",
              "--fp16, or fairseq-train's --amp (docs/GPU.md)")
    p.flag("--cpu-smoke", default=False)
    p.flag("--dry-run", default=False)
    return p


# ---------------------------------------------------------------------------------------------
# the checks

def parse_train_argv(argv):
    """fairseq-train's parse of ``argv`` with the plugin of its --user-dir loaded; every refusal
    as a one-line :class:`OptionError` (fairseq's 200-line usage, or a traceback, otherwise)."""
    from fairseq import options, utils
    from slim_fairseq.option_errors import unknown_arch

    user = _value(argv, "--user-dir")
    if user:
        utils.import_user_module(argparse.Namespace(user_dir=user))
    from fairseq.models import ARCH_MODEL_REGISTRY
    arch = _value(argv, "--arch")
    if arch is not None and arch not in ARCH_MODEL_REGISTRY:
        raise OptionError(str(unknown_arch(arch)))
    train_parser = options.get_training_parser()

    def error(message):
        if message.startswith("unrecognized arguments: "):
            flags = message.split(": ", 1)[1]
            task = _value(argv, "--task")
            context = f" with --arch {arch}" + (f" --task {task}" if task else "")
            raise tools.not_options(flags, "fairseq-train", context, f" and slim-fairseq-help {arch or 'ARCH'}")
        raise cli.argparse_refusal(message, "the options of fairseq-train --help and "
                                   f"slim-fairseq-help {arch or 'ARCH'}")

    train_parser.error = error
    try:
        return options.parse_args_and_arch(train_parser, input_args=argv)
    except ValueError as error:  # the plugin's one-line option errors
        if "\n" in str(error):
            raise
        raise OptionError(str(error)) from None
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, str) else str(stop)
        raise OptionError(code.split(": error: ", 1)[-1]) from None


def _value(argv, flag):
    """The value of the last ``flag`` in a fairseq command line (either spelling)."""
    found = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def check_arch_kind(recipe, arch):
    """An encoder-decoder arch for a translation recipe, a language model for an LM recipe."""
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoderDecoderModel
    from slim_fairseq.option_errors import unknown_arch
    if arch not in ARCH_MODEL_REGISTRY:
        raise OptionError(str(unknown_arch(arch)))
    lm = not issubclass(ARCH_MODEL_REGISTRY[arch], FairseqEncoderDecoderModel)
    if lm == (recipe.task == "language_modeling"):
        return
    kind = "a language model" if lm else "an encoder-decoder (translation) model"
    trains = "language models" if recipe.task == "language_modeling" else "translation models"
    other = "a language-model recipe (examples/lm/train-*.sh)" if lm else \
        "a translation recipe (examples/translation/train-*.sh)"
    raise refuse(f"--arch={arch}", f"{kind}, and {recipe.prog} trains {trains}", f"--arch {recipe.arch}, or {other}")


def check_command(recipe, argv, given, arch):
    """The fairseq-train command line ``argv`` (without the program), parsed once; a refusal
    about options the recipe added (none of ``given``, the flags the user wrote) names the arch."""
    try:
        return parse_train_argv(argv)
    except OptionError as error:
        subject = str(error).split(": ", 1)[0]  # the options the refusal is about
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", subject))
        if named and not named & given and arch != recipe.arch:
            why = str(error).split("; allowed: ", 1)[0]  # what it proposes is about the user's options
            raise refuse(f"--arch={arch}", f"{recipe.prog} sets {', '.join(sorted(named))} for its "
                         f"archs, which {arch} refuses ({why})", f"--arch {recipe.arch}") from None
        raise


def check_save_dir(save_dir, data, arch, restore_file, recipe=None):
    """fairseq-train resumes from SAVE_DIR/checkpoint_last.pt: refuse a folder that holds a run
    on other data (it would be resumed, or taken as finished, on DATA_BIN), a checkpoint of
    another architecture, or one that is not complete. The checkpoint's own arch is proposed
    only where ``recipe`` trains it."""
    trained_on_data = os.path.realpath(data)
    record = os.path.join(save_dir, "recipe.data")
    if os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            trained_on = f.read().strip()
        if trained_on != trained_on_data:
            raise refuse(f"--save-dir={save_dir}", f"holds a run on {trained_on} that fairseq would resume "
                         f"on {trained_on_data}", f"a --save-dir of its own for this data-bin (or delete "
                         f"{record} to continue that model on it)")
    if restore_file not in (None, "checkpoint_last.pt"):
        return
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return
    try:
        state = checkpoints.load(last, mmap=True)
    except checkpoints.OptionError as error:
        earlier = checkpoints.complete_neighbour(last)
        restore = f"--restore-file {earlier} (an earlier checkpoint of that run)" if earlier else \
            "--restore-file with an earlier checkpoint of that run"
        raise refuse(f"--save-dir={save_dir}", f"fairseq would resume from {error}",
                     f"a --save-dir of its own, or {restore}") from None
    old = checkpoints.arch(state)
    if old and old != arch:
        try:
            if recipe is not None:
                check_arch_kind(recipe, old)
            resume = f"--arch {old} (to go on training it), or "
        except OptionError:  # a model of the other kind, which this recipe refuses
            resume = ""
        raise refuse(f"--save-dir={save_dir}", f"its checkpoint_last.pt is a {old} model, which fairseq would "
                     f"resume as {arch}", f"{resume}a --save-dir of its own")


# ---------------------------------------------------------------------------------------------
# the launch

def main(recipe, argv=None):
    return cli.run(recipe.prog, recipe.help, lambda words: train(recipe, words), argv)


def train(recipe, argv):
    args, extra = cli.split(parser(recipe), argv, ("DATA_BIN",), pass_through=True)
    extra = cli.negative_values_joined(extra)
    data = args.data_bin
    if not data:
        raise refuse("DATA_BIN", "missing", "the data-bin of a prepare script as the first argument (see --help)")
    if not os.path.isdir(data.split(":")[0]):
        raise refuse(f"DATA_BIN={data}", "not a folder", "the data-bin a prepare script (or fairseq-preprocess) wrote")
    arch = args.arch
    notes = []
    max_tokens = int(args.max_tokens or recipe.max_tokens)
    sentences = 0
    hparams = list(recipe.hparams)
    if args.paper:
        if recipe.paper_none:
            raise refuse("--paper", recipe.paper_none, "no --paper (the settings of this script, in "
                         "--help)")
        sentences = recipe.paper_sentences
        if sentences and args.max_tokens:
            raise refuse(f"--max-tokens={args.max_tokens}", f"--paper batches by {recipe.paper_unit} "
                         f"({sentences} per update, as the paper)", "no --max-tokens, or no --paper")
        hparams += recipe.paper_args
        if recipe.paper_args:
            notes.append(f"--paper: {' '.join(recipe.paper_args)}")
        notes += [f"--paper: {note}" for note in recipe.paper_notes]
    save_dir = args.save_dir or f"checkpoints/{arch}"
    plugin = tools.user_dir()
    cmd = ["fairseq-train", data, "--user-dir", plugin, "--arch", arch, *recipe.task_args, *hparams,
           "--save-dir", save_dir]
    given = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=plugin))
    check_arch_kind(recipe, arch)

    if args.cpu_smoke:
        cmd += [*SMOKE, *recipe.smoke_args]
        if sentences > 0:
            cmd += ["--batch-size", str(sentences)]
        for flag, value in (("--max-tokens", args.max_tokens), ("--batch-size", args.batch_size),
                            ("--update-freq", args.update_freq)):
            if value:
                cmd += [flag, value]
        cmd += extra
        parsed = check_command(recipe, cmd[1:], given, arch)
        check_data(parsed)
        check_save_dir(save_dir, data, arch, getattr(parsed, "restore_file", None), recipe)
        from fairseq.models import ARCH_MODEL_REGISTRY
        from slim_fairseq_lab.contract import tiny_overrides
        plugin_arch = ARCH_MODEL_REGISTRY[arch].__module__.startswith("slim_fairseq.")
        shrink = tiny_overrides(arch) if plugin_arch else []  # fairseq's own: as --cpu-smoke sets
        print(f"+ (tiny overrides of {arch} appended) {shlex.join(cmd)}", flush=True)
        if not args.dry_run:
            launch(cmd + [str(word) for word in shrink], save_dir, data, parsed)
        return 0

    visible = None
    gpus = args.gpus
    if gpus is None:
        visible = gpu_count()
        gpus = visible
        if args.paper and recipe.paper_gpus and gpus > recipe.paper_gpus:
            gpus = recipe.paper_gpus
            notes.append(f"--paper: {gpus} of the {visible} visible GPUs, as the paper ({recipe.paper_hardware}); "
                         "--gpus N to use more")
    gpus, nodes = int(gpus), int(args.nodes)
    world = nodes * (gpus if gpus > 0 else 1)
    if args.paper and recipe.paper_hardware:
        where = "CPU" if gpus == 0 else f"{gpus} GPU(s) x {nodes} node(s)"
        notes.append(f"--paper: the paper trained on {recipe.paper_hardware}; this run: {world} worker(s) ({where})")
    precision = args.precision
    if args.paper and recipe.paper_precision:
        if not precision:
            if gpus == 0:
                raise refuse("--paper", f"the paper trained with mixed precision ({recipe.paper_precision}), which "
                             "needs GPUs, and this run trains on the CPU", "drop --paper, or --gpus N on a machine "
                             "with GPUs")
            precision = recipe.paper_precision
            notes.append(f"--paper: {precision} (the paper trained with mixed precision)")
        else:
            notes.append(f"--paper: mixed precision as the paper, in {precision}")
    if precision and gpus == 0:
        raise refuse(precision, "mixed precision needs CUDA GPUs, and this run trains on the CPU",
                     f"drop {precision}, or --gpus N on a machine with GPUs")
    if gpus == 0 and nodes != 1:
        raise refuse(f"--nodes={nodes}", "several nodes need GPUs", "--gpus N")
    if not args.dry_run and args.gpus is not None and gpus > 0:
        visible = gpu_count() if visible is None else visible
        if gpus > visible:
            raise refuse(f"--gpus={gpus}", f"this machine shows {visible} CUDA GPU(s)", f"--gpus {visible}")

    update_freq = args.update_freq
    if sentences > 0:
        # the paper's batch counts sentences: split it over the workers, unless --batch-size
        # gives the sentences per worker
        update_freq = int(update_freq or 1)
        if args.batch_size:
            per_worker = int(args.batch_size)
        else:
            if sentences % world:
                raise refuse("--paper", f"{sentences} {recipe.paper_unit} per update do not split evenly over "
                             f"{world} workers", f"--gpus and --nodes giving a number of workers that "
                             f"divides {sentences}, or --batch-size N per worker")
            per_worker = sentences // world
        batch = ["--batch-size", str(per_worker), "--update-freq", str(update_freq)]
        total = per_worker * update_freq * world
        unit = recipe.paper_unit
        per_update = f"{per_worker} {unit} x update-freq {update_freq} x {world} workers = {total} {unit} per update"
        if total != sentences:
            per_update += f" (the paper: {sentences})"
    else:
        if not update_freq:
            update_freq = 1
            if recipe.tokens_per_update > 0:
                update_freq = math.ceil(recipe.tokens_per_update / (max_tokens * world))
        update_freq = int(update_freq)
        batch = ["--max-tokens", str(max_tokens), "--update-freq", str(update_freq)]
        per_update = (f"{max_tokens} tokens x update-freq {update_freq} x {world} workers = "
                      f"{max_tokens * update_freq * world} tokens per update (at most)")
        if recipe.tokens_per_update > 0:
            per_update += f"; recipe target {recipe.tokens_per_update}"
        if args.batch_size:
            batch += ["--batch-size", args.batch_size]
            per_update += f"; at most {args.batch_size} sentences per worker batch (--batch-size)"
    cmd += batch
    if gpus == 0:
        cmd.append("--cpu")
    if precision:
        cmd.append(precision)
    parsed = check_command(recipe, cmd[1:] + extra, given, arch)
    check_data(parsed)
    check_save_dir(save_dir, data, arch, getattr(parsed, "restore_file", None), recipe)

    if nodes > 1 and not args.init_method:
        cmd = ["torchrun", "--nnodes", str(nodes), "--node-rank", args.node_rank, "--nproc-per-node", str(gpus),
               "--master-addr", args.master_addr, "--master-port", args.master_port, tools.find("fairseq-train"),
               *cmd[1:], "--distributed-world-size", str(world)]
    elif args.init_method:
        cmd += ["--distributed-init-method", args.init_method, "--distributed-world-size", str(world),
                "--distributed-rank", str(int(args.node_rank) * gpus)]
    else:
        cmd += ["--distributed-world-size", str(world)]
    cmd += extra
    for note in notes + [f"effective batch: {per_update}"]:
        cli.log(note)
    print("+ " + shlex.join(cmd), flush=True)
    if not args.dry_run:
        launch(cmd, save_dir, data, parsed)
    return 0


def check_data(parsed):
    """The data-bin holds what the task of the parsed command reads, the values can train and
    the save-dir can be written (the checks of fairseq-train with the plugin)."""
    from slim_fairseq import run_checks
    # the plugin imported as a package: its class, not the lab's copy (paths.plugin_module)
    from slim_fairseq.option_errors import OptionError as PluginRefusal
    valid = () if parsed.disable_validation else tuple(s for s in parsed.valid_subset.split(",") if s)
    try:
        run_checks.check_data_bin(parsed.data, parsed.task, parsed.train_subset, valid, name="DATA_BIN",
                                  recipe=True)
        run_checks.check_values(parsed)
        run_checks.check_data_files(parsed, name="DATA_BIN")
        run_checks.check_save_dir(parsed.save_dir)
    except PluginRefusal as error:
        raise OptionError(str(error)) from None


def data_record(parsed):
    """The record of the dictionaries the parsed fairseq-train command trains with and of a new
    run (slim_fairseq/data_record.py), as the plugin's models keep it in their checkpoints: kept
    in the save-dir for fairseq's own models, whose checkpoints carry none."""
    from fairseq.data import data_utils
    from slim_fairseq import data_record as records
    data = parsed.data.split(os.pathsep)[0]
    if parsed.task == "language_modeling":
        names = {"dictionary": "dict.txt"}
    else:
        src, tgt = getattr(parsed, "source_lang", None), getattr(parsed, "target_lang", None)
        if src is None or tgt is None:
            src, tgt = data_utils.infer_language_pair(data)
        names = {"source": f"dict.{src}.txt", "target": f"dict.{tgt}.txt"}
    entries = {name: records.dictionary_entry(checkpoints.read_dictionary(os.path.join(data, file)),
                                              os.path.join(data, file)) for name, file in names.items()}
    return records.make(entries, os.path.realpath(data))


def check_save_dir_data(save_dir, parsed):
    """The run SAVE_DIR holds (its data_record.json) was trained with the dictionaries of the
    data-bin it would be resumed on."""
    from slim_fairseq import data_record as records
    path = os.path.join(save_dir, records.SAVE_DIR_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            trained = json.load(f)
    except (OSError, ValueError):
        return
    if records.is_record(trained):
        problem = records.mismatch(data_record(parsed), trained, f"the run in {save_dir}",
                                   "a --save-dir of its own for this data-bin")
        if problem:
            raise OptionError(problem)


def launch(cmd, save_dir, data, parsed=None):
    """Run fairseq-train, after taking the save-dir for this run (one run per save-dir:
    :mod:`slim_fairseq.save_dir_lock`) and noting the data-bin in SAVE_DIR/recipe.data and its
    dictionaries and the run in SAVE_DIR/data_record.json (kept when the run resumes); a run that
    fails before it saved a checkpoint leaves the save-dir as it was."""
    from slim_fairseq import save_dir_lock
    if parsed is not None:
        check_save_dir_data(save_dir, parsed)
    created = not os.path.isdir(save_dir)
    record = os.path.join(save_dir, "recipe.data")
    wrote_record = not os.path.isfile(record)
    before = set() if created else set(os.listdir(save_dir))
    try:
        note = save_dir_lock.take(save_dir)
    except save_dir_lock.SaveDirInUse as error:
        raise OptionError(str(save_dir_lock.in_use_error(error))) from None
    if note:
        cli.log(note)
    try:
        _run_in(cmd, save_dir, data, parsed, created, record, wrote_record, before)
    finally:
        save_dir_lock.release(save_dir)


def _run_in(cmd, save_dir, data, parsed, created, record, wrote_record, before):
    """fairseq-train in the save-dir this recipe holds (it is told so: it takes the lock in
    fairseq-train with the plugin too)."""
    from slim_fairseq import save_dir_lock
    from slim_fairseq.data_record import SAVE_DIR_FILE
    if wrote_record:
        with open(record, "w", encoding="utf-8") as f:
            f.write(os.path.realpath(data) + "\n")
    dictionaries = os.path.join(save_dir, SAVE_DIR_FILE)
    if parsed is not None and not os.path.isfile(dictionaries):
        with open(dictionaries, "w", encoding="utf-8") as f:
            json.dump(data_record(parsed), f)
    try:
        tools.run(cmd, env={save_dir_lock.HOLDER_ENV: str(os.getpid())})
    except (OptionError, tools.Interrupted):
        saved = [name for name in set(os.listdir(save_dir)) - before
                 if re.fullmatch(r"checkpoint[_\d]*(best|last)?\.pt", name)]
        if not saved:
            if created:
                shutil.rmtree(save_dir, ignore_errors=True)
            else:
                for name in {"recipe.data", "crash.pt", SAVE_DIR_FILE} - before:
                    if name != "recipe.data" or wrote_record:
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(os.path.join(save_dir, name))
        raise
