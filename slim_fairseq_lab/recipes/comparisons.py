"""The bundled-corpus comparisons of examples/: two translation models side by side on the
bundled en-de (translation/*_vs_transformer.sh), or several language models on the bundled
WikiText-2 (lm/skipless_vs_preln.sh, lm/stlm_tying_wikitext2.sh). The fairseq-train and
fairseq-generate command lines are slim_fairseq_lab.launcher's; the table is
slim_fairseq_lab.run_summary's (examples/summarize_runs.py)."""
import concurrent.futures
import dataclasses
import os
import re
import shutil
import time

from slim_fairseq_lab import data as bundled
from slim_fairseq_lab import launcher
from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.recipes import tools
from slim_fairseq_lab.recipes.cli import log, refuse, step_failed
from slim_fairseq_lab.run_summary import summarize


@dataclasses.dataclass
class EndeComparison:
    """Settings of a two-model comparison on the bundled en-de: ``out`` (its folder), the same
    seed, schedule and batches for both models (``shape`` plus each model's own arguments),
    ``generate_args`` for both translations, ``threads`` per model, ``parallel`` (both at once),
    ``dry_run`` (print the two fairseq-train commands), ``eval_only`` (reuse the checkpoints of
    an earlier run), ``note`` (added to the wall-time line)."""
    out: str
    max_update: int
    max_tokens: int
    warmup: int
    seed: int
    log_interval: int
    shape: tuple
    generate_args: tuple = ()
    threads: str = "1"
    parallel: bool = True
    dry_run: bool = False
    eval_only: bool = False
    note: str = ""


def add_run_options(parser):
    """--sequential, --eval-only and --dry-run of the en-de comparisons."""
    parser.flag("--sequential", default=False)
    parser.flag("--eval-only", default=False)
    parser.flag("--dry-run", default=False)


def compare_on_bundled_ende(settings, models):
    """Binarize the bundled en-de corpus under OUT/data (cached), train both ``models`` ((name,
    fairseq-train arguments) pairs) alike, translate the test set with each model's
    checkpoint_last.pt (beam 5, BPE removed), print the table of examples/summarize_runs.py and,
    under it, what its test BLEU is (:func:`test_bleu_note`)."""
    if settings.dry_run:
        data = os.path.join(settings.out, "data", "DATA-BIN")
        for name, args in models:
            print(f"{name}: fairseq-train {' '.join(train_argv(settings, data, name, args))}", flush=True)
        return 0
    for tool in ("fairseq-train", "fairseq-generate"):
        tools.find(tool)
    os.makedirs(settings.out, exist_ok=True)
    data = bundled.binarize_ende(os.path.join(settings.out, "data"))
    if not os.path.isfile(os.path.join(data, "dict.en.txt")):
        raise step_failed(f"binarization failed ({data})")
    start = time.time()
    if settings.parallel:
        with concurrent.futures.ThreadPoolExecutor(len(models)) as pool:
            jobs = [(name, pool.submit(train_and_translate, settings, data, name, args)) for name, args in models]
            failed = [name for name, job in jobs if not job.result()]
    else:
        failed = []
        for name, args in models:
            if not train_and_translate(settings, data, name, args):
                raise step_failed(f"{name} failed: see the logs under {settings.out}/{name}")
    if failed:
        raise step_failed(f"{' '.join(failed)} failed: see the logs under {settings.out}/{failed[0]}")
    print(f"wall time: {int(time.time() - start)} s (updates: {settings.max_update}, max tokens: {settings.max_tokens}, "
          f"warmup: {settings.warmup}, seed: {settings.seed}, threads per model: {settings.threads}"
          + (f", {settings.note})" if settings.note else ")"))
    names = [name for name, _ in models]
    print("\n".join(summarize(settings.out, names)))
    print("\n".join(test_bleu_note(settings.out, names)), flush=True)
    return 0


def train_argv(settings, data, name, args):
    return launcher.ende_comparison_train_argv(data, settings.seed, settings.warmup, settings.max_tokens,
                                               settings.max_update, settings.log_interval,
                                               [*settings.shape, *args], os.path.join(settings.out, name))


def train_and_translate(settings, data, name, args):
    """One model of :func:`compare_on_bundled_ende`: its training (unless eval_only) and its
    translation of the test set; whether both succeeded."""
    folder = os.path.join(settings.out, name)
    env = {"OMP_NUM_THREADS": settings.threads}
    if not settings.eval_only:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        if tools.run(["fairseq-train", *train_argv(settings, data, name, args)], log=os.path.join(folder, "train.log"),
                     env=env, check=False):
            return False
    generate = launcher.ende_comparison_generate_argv(data, os.path.join(folder, "checkpoint_last.pt"),
                                                      tools.user_dir(), settings.generate_args)
    return tools.run(["fairseq-generate", *generate], log=os.path.join(folder, "generate.log"), env=env,
                     check=False) == 0


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def test_bleu_note(out, names):
    """What the "test BLEU" of :func:`compare_on_bundled_ende`'s table is, read from each run's
    generate.log (the scorer) and train.log (the checkpoint it translated with)."""
    scorers = set()
    for name in names:
        found = re.search(r"BLEU4? = ", _read(os.path.join(out, name, "generate.log")))
        scorers.add(found.group(0) if found else "")
    if scorers == {"BLEU4 = "}:
        lines = ["test BLEU: fairseq-generate's BLEU4 (fairseq's own scorer on the BPE-removed output and references "
                 "split at spaces: tokenized BLEU on Moses tokens (-a), no compound splitting; not sacreBLEU), beam "
                 "5, bundled en-de test set, translated with:"]
    elif scorers == {"BLEU = "}:
        lines = ["test BLEU: fairseq-generate --scoring sacrebleu on the tokenized, BPE-removed text (not "
                 "detokenized: not comparable with published sacreBLEU), beam 5, translated with:"]
    else:
        lines = [f"test BLEU: the generate logs hold no score of one kind ({out}/NAME/generate.log); translated with:"]
    for name in names:
        # the last checkpoint fairseq saved is the state of checkpoint_last.pt
        saved = re.findall(r"Saved checkpoint \S+ \((epoch \d+ @ \d+ updates)", _read(os.path.join(out, name, "train.log")))
        lines.append(f"  {name}: {out}/{name}/checkpoint_last.pt "
                     f"({saved[-1] if saved else f'its update is not in {out}/{name}/train.log'})")
    return lines


@dataclasses.dataclass
class LmComparison:
    """Settings of a WikiText-2 comparison, from the environment (the scripts' usage): the runs
    (``runs``: name -> that run's --arch and shape, as words), ``updates``, ``batch`` blocks of
    ``tokens`` tokens, ``lr``, ``seed``, ``jobs`` at a time, a vocabulary of ``nwords`` words,
    ``train_args`` for every run."""
    out: str
    runs: dict
    chosen: list
    updates: int
    batch: int
    tokens: int
    lr: str
    seed: int
    jobs: int
    nwords: int
    train_args: tuple = ()
    dry_run: bool = False


def lm_settings(out, runs, default_runs, **defaults):
    """An :class:`LmComparison` from the environment (UPDATES, BATCH, TOKENS, LR, SEED, JOBS,
    NWORDS, RUNS, DRY_RUN) over ``defaults``; an unknown run in RUNS is refused."""
    env = os.environ
    chosen = env.get("RUNS", default_runs).split()
    for name in chosen:
        if name not in runs:
            raise refuse(f"RUNS={name}", "not a run of this comparison",
                         f"names among {' '.join(runs)}")
    values = {key: env.get(key.upper(), str(value)) for key, value in defaults.items()}
    return LmComparison(out=out, runs=runs, chosen=chosen, updates=int(values["updates"]),
                        batch=int(values["batch"]), tokens=int(values["tokens"]), lr=values["lr"],
                        seed=int(values["seed"]), jobs=int(values["jobs"]), nwords=int(values["nwords"]),
                        dry_run=env.get("DRY_RUN", "0") == "1")


def compare_lms_on_wikitext2(settings):
    """Binarize the bundled WikiText-2 with a vocabulary of NWORDS words under build/data
    (cached), then train the chosen runs, JOBS at a time, one thread each, with the same updates,
    batches, seed, Adam schedule (warm-up a tenth of the updates) and gradient clipping 1.0; each
    run's log goes to OUT/NAME.log and the table of examples/summarize_runs.py to
    OUT/summary.txt. Returns the data-bin."""
    binary = os.environ.get("FAIRSEQ_BIN") or os.path.join(REPO_ROOT, ".venv", "bin")
    if settings.dry_run:
        data = os.path.join(REPO_ROOT, "build", "data", "DATA-BIN")
    else:
        os.makedirs(settings.out, exist_ok=True)
        data = bundled.binarize_wikitext(os.path.join(REPO_ROOT, "build", "data"), nwords=settings.nwords)
        if not os.path.isfile(os.path.join(data, "dict.txt")):
            raise step_failed(f"binarization failed ({data})")
        print(f"data: {data}  out: {settings.out}  updates: {settings.updates} x {settings.batch} x {settings.tokens} "
              f"tokens  seed: {settings.seed}", flush=True)
    commands = {}
    for name in settings.chosen:
        train = launcher.lm_comparison_train_argv(data, tools.user_dir(), settings.tokens, settings.batch,
                                                  settings.updates, settings.seed, settings.lr,
                                                  [*settings.runs[name].split(), *settings.train_args])
        commands[name] = [f"{binary}/fairseq-train", *train]
        if settings.dry_run:
            print(f"{name}: {' '.join(commands[name])}", flush=True)
    if settings.dry_run:
        return data
    env = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with concurrent.futures.ThreadPoolExecutor(settings.jobs) as pool:
        jobs = {name: pool.submit(tools.run, command, log=os.path.join(settings.out, f"{name}.log"), env=env,
                                  check=False) for name, command in commands.items()}
        failed = [name for name, job in jobs.items() if job.result() != 0]
    table = "\n".join(summarize(settings.out, settings.chosen)) + "\n"
    print(table, end="", flush=True)
    with open(os.path.join(settings.out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(table)
    for name in failed:
        log(f"error: run {name} failed, see {settings.out}/{name}.log")
    if failed:
        raise step_failed(f"{len(failed)} of {len(commands)} runs failed: {' '.join(failed)}")
    return data
