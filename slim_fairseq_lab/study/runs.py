"""One run of the study: what it is (:class:`Job`), where it trains, whether it already finished
or can resume from an interrupted attempt, and training and evaluating it (:func:`execute_run`).

A run's identity is its fairseq-train settings without paths and checkpoint-writing options
(:func:`settings_key`): a finished run (``runs/<tag>/run.json``) is reused by any later call with
the same settings, also from a moved or cloned study folder.
"""
import collections
import json
import os
import re
import threading
import time

from slim_fairseq_lab import fairseq_logs, launcher
from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.study.summary import with_checkpoint_metrics

_LOG_LOCK = threading.Lock()


def log(message):
    """A progress line of the study (runs train in threads: one line at a time)."""
    with _LOG_LOCK:
        print(f"[quality] {message}", flush=True)


def fmt_lr(lr):
    return f"{lr:g}"


#: one planned training run of the study: a model spec (corpus, label, arch, overrides, whether it
#: is the corpus's baseline) at one width, rate and seed, and the directory it trains in
Job = collections.namedtuple("Job", "corpus label arch overrides baseline dim lr seed save_dir")


def job_argv(job, data, args):
    """fairseq-train's arguments for ``job``; ``data`` maps each corpus to its data-bin."""
    return launcher.study_train_argv(job.corpus, data[job.corpus], job.arch, job.overrides, args, job.seed,
                                     job.save_dir, job.dim, job.lr)


def run_tag(corpus, label, dim, lr, seed, single_dim, single_lr):
    """Folder name of a run; a study of one width (one rate) leaves the width (rate) out."""
    parts = [corpus, label] + ([] if single_dim else [f"d{dim}"]) + ([] if single_lr else [f"lr{fmt_lr(lr)}"])
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(parts) + f"_s{seed}")


# left out of a run's settings: paths that differ between machines or clones, and how often
# checkpoints are written (which does not change training)
_UNKEYED_WITH_VALUE = ("--save-dir", "--user-dir", "--save-interval-updates", "--keep-interval-updates")
_UNKEYED = ("--no-epoch-checkpoints", "--no-last-checkpoints")


# a language model's input and output widths default to its width: given equal to it, they
# restate the default (the LM presets of slim_lm take them; earlier STLM classes did not)
_WIDTH_RESTATED = ("--decoder-input-dim", "--decoder-output-dim")


def comparable_settings(tokens):
    """``tokens`` (training options) without the ones a run's identity does not depend on:
    paths, how often checkpoints are written, and LM input/output widths equal to the width."""
    width = None
    if "--decoder-embed-dim" in tokens[:-1]:
        width = tokens[tokens.index("--decoder-embed-dim") + 1]
    key, skip = [], False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        restated = token in _WIDTH_RESTATED and i + 1 < len(tokens) and tokens[i + 1] == width
        if token in _UNKEYED_WITH_VALUE or restated:
            skip = True
            continue
        if token not in _UNKEYED:
            key.append(token)
    return key


def settings_key(argv):
    """A run's training settings, for resuming: the options after the data-bin (argv[0]),
    without paths and checkpoint-writing options (:func:`comparable_settings`)."""
    return comparable_settings(argv[1:])


def recorded_run(job, argv, args):
    """The finished run of ``job`` (its run.json) when it was trained with the same settings and
    has everything asked for; else None."""
    corpus, save_dir = job.corpus, job.save_dir
    done_path = os.path.join(save_dir, "run.json")
    if args.no_resume or not os.path.exists(done_path):
        return None
    with open(done_path) as f:
        run = json.load(f)
    have_checkpoint = not args.keep_checkpoints or os.path.exists(os.path.join(save_dir, "checkpoint_best.pt"))
    if (comparable_settings(run.get("settings") or []) == settings_key(argv) and have_checkpoint
            and (corpus != "ende" or args.no_bleu or "test_bleu" in run)):
        return run
    return None


def resumable(save_dir, argv, args):
    """Whether an interrupted attempt with the same settings left a checkpoint_last.pt that
    fairseq-train can go on from."""
    started_path = os.path.join(save_dir, "started.json")
    if args.no_resume or not os.path.exists(started_path):
        return False
    with open(started_path) as f:
        return json.load(f).get("settings") == settings_key(argv) and os.path.exists(
            os.path.join(save_dir, "checkpoint_last.pt"))


def execute_run(job, data, args):
    """Train (and for en-de translate) one run; reuse its run.json when it already finished."""
    corpus, label, arch, overrides, baseline, dim, lr, seed, save_dir = job
    argv = job_argv(job, data, args)
    run = recorded_run(job, argv, args)
    if run is not None:
        return run, True
    done_path = os.path.join(save_dir, "run.json")
    os.makedirs(save_dir, exist_ok=True)
    # an interrupted attempt with the same settings left checkpoint_last.pt: fairseq-train goes
    # on from it and the log is continued; anything else starts afresh
    started_path = os.path.join(save_dir, "started.json")
    resume = resumable(save_dir, argv, args)
    if not resume:
        remove_checkpoints(save_dir, keep_best=False)
        with open(started_path, "w") as f:
            json.dump({"settings": settings_key(argv)}, f)
    else:
        log(f"resuming {save_dir} from its checkpoint_last.pt")
    start = time.time()
    output = launcher.run_tool("fairseq-train", argv, os.path.join(save_dir, "train.log"), args.threads,
                               append=resume)
    seconds = time.time() - start
    curve = fairseq_logs.valid_points(output)
    if not curve:
        raise RuntimeError(f"no validation record in {save_dir}/train.log")
    run = {"corpus": corpus, "label": label, "arch": arch, "overrides": overrides, "seed": seed,
           "dim": dim, "lr": lr, "baseline": baseline, "params": fairseq_logs.parameter_count(output),
           "valid_curve": curve, "updates": curve[-1][0], "train_seconds": seconds,
           "train_wps": fairseq_logs.train_tokens_per_second(output),
           "settings": settings_key(argv)}  # without paths, so a moved or cloned study still resumes
    with_checkpoint_metrics(run)
    if resume:
        # this attempt trained from the checkpoint's update on: its time, scaled to the whole run
        # (what --dry-run estimates from); train_wps is this attempt's
        first = fairseq_logs.resumed_from_update(output)
        if 0 < first < run["updates"]:
            run["train_seconds"] = seconds * run["updates"] / (run["updates"] - first)
        run["resumed"] = True
    if corpus == "ende" and not args.no_bleu:
        gen = launcher.run_tool("fairseq-generate",
                                launcher.study_generate_argv(data[corpus], save_dir, args.bpe_codes),
                                os.path.join(save_dir, "generate.log"), args.threads)
        run["test_bleu"] = fairseq_logs.bleu(gen)
    with open(done_path + ".tmp", "w") as f:
        json.dump(run, f, indent=1)
    os.replace(done_path + ".tmp", done_path)
    remove_checkpoints(save_dir, keep_best=args.keep_checkpoints)  # keep the results small
    if os.path.exists(started_path):
        os.remove(started_path)
    return run, False


def remove_checkpoints(save_dir, keep_best):
    """Delete the run's checkpoints (all but checkpoint_best.pt when ``keep_best``)."""
    for name in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        if name.startswith("checkpoint") and name.endswith(".pt") and not (
                keep_best and name == "checkpoint_best.pt"):
            os.remove(os.path.join(save_dir, name))


def corpus_data(corpus, args):
    """The data-bin of ``corpus``: --ende-data / --lm-data, else the bundled corpus binarized
    under build/data (cached), in which case an en-de without --bpe-codes gets its BPE codes."""
    from slim_fairseq_lab import data
    if corpus == "ende":
        if args.ende_data:
            return args.ende_data
        data_bin = data.binarize_ende(eval_subset=args.eval_subset)
        args.bpe_codes = args.bpe_codes or data.ende_paths(
            os.path.join(REPO_ROOT, "build", "data"), eval_subset=args.eval_subset)["codes"]
        return data_bin
    if args.lm_data:
        return args.lm_data
    return data.binarize_wikitext(nwords=args.lm_vocab)
