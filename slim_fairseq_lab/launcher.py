"""The one place that builds fairseq command lines; fairseq's tools start through
:func:`run_tool`, over the recipes' runner (:func:`slim_fairseq_lab.recipes.tools.run`).

The study (:mod:`slim_fairseq_lab.study`), the benchmark, the compression demo and the
comparisons of ``examples/`` (:mod:`slim_fairseq_lab.recipes.comparisons`) take their
fairseq-train / fairseq-generate arguments from the builders here, composed of the same option
groups: the task, the criterion, Adam with the inverse-square-root schedule, and the test-set
translation. Every tool started either way gets the same malloc settings
(:data:`slim_fairseq_lab.recipes.tools.ALLOCATOR_ENV`).

It imports only the standard library (and this package's modules that do the same) at import
time.
"""
import os
import sys

from slim_fairseq_lab import fairseq_logs
from slim_fairseq_lab.paths import PLUGIN_DIR
from slim_fairseq_lab.recipes import tools
from slim_fairseq_lab.recipes.tools import ALLOCATOR_ENV  # noqa: F401 (the settings' one home)

BIN = os.path.dirname(sys.executable)



def log(message):
    print(f"[launcher] {message}", flush=True)


# ----------------------------------------------------------------------------------------------
# running a tool

def tool_environment(threads, allocator_env=True):
    """The environment of a launched fairseq tool: ``threads`` OpenMP / MKL threads, Python
    warnings off, and :data:`ALLOCATOR_ENV` under the caller's values (``allocator_env=False``:
    glibc's defaults, every ``MALLOC_*`` variable of :data:`ALLOCATOR_ENV` removed)."""
    return tools.environment(_thread_env(threads), allocator=allocator_env)


def _thread_env(threads):
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONWARNINGS": "ignore"}


def run_tool(tool, argv, log_path, threads, append=False, allocator_env=True):
    """Run a fairseq console script of this environment with :func:`tools.run` (the one way the
    lab starts a tool: its own process group, stopped with the caller), its output streamed to
    ``log_path`` after its command line (continued when ``append``), and return the whole log.
    A tool killed by a signal after its last line (:func:`fairseq_logs.completion_line`) counts
    as finished: its work was saved."""
    cmd = [os.path.join(BIN, tool), *map(str, argv)]
    with open(log_path, "a" if append else "w") as f:  # streamed: progress can be followed
        f.write(" ".join(cmd) + "\n")
    status = tools.run(cmd, log=log_path, append=True, env=_thread_env(threads),
                       allocator=allocator_env, check=False)
    with open(log_path) as f:
        output = f.read()
    if status != 0:
        done = fairseq_logs.completion_line(tool, output)
        if status < 0 and done:
            # seen once in CI: "terminate called without an active exception", SIGABRT, during
            # interpreter shutdown after fairseq-train had saved its checkpoint
            note = (f"{tool} was killed by signal {-status} after it printed "
                    f"{done!r}; its results are complete and kept")
            with open(log_path, "a") as f:
                f.write(f"[launcher] {note}\n")
            log(f"{note} ({log_path})")
            return output
        raise RuntimeError(f"{tool} failed ({status}), see {log_path}:\n{output[-3000:]}")
    return output


# ----------------------------------------------------------------------------------------------
# option groups

def task_options(corpus, tokens_per_sample=None):
    """fairseq's task for ``corpus``: ``ende`` (translation en -> de) or ``wikitext`` (language
    modelling on blocks of ``tokens_per_sample`` tokens across sentence boundaries)."""
    if corpus == "ende":
        return ["--task", "translation", "--source-lang", "en", "--target-lang", "de"]
    return ["--task", "language_modeling", "--tokens-per-sample", str(tokens_per_sample),
            "--sample-break-mode", "none"]


def criterion_options(corpus):
    """Label-smoothed cross-entropy (0.1) for translation, cross-entropy for language models."""
    if corpus == "ende":
        return ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    return ["--criterion", "cross_entropy"]


def adam_options(warmup, lr=None, warmup_init_lr=None, clip_norm=None):
    """Adam (betas 0.9, 0.98) with fairseq's inverse-square-root schedule after ``warmup``
    updates; ``lr`` None leaves the rate to the caller's model options."""
    argv = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)"]
    argv += [] if lr is None else ["--lr", str(lr)]
    argv += ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup)]
    argv += [] if warmup_init_lr is None else ["--warmup-init-lr", warmup_init_lr]
    argv += [] if clip_norm is None else ["--clip-norm", clip_norm]
    return argv


def translate_test_argv(data, checkpoint, user_dir=PLUGIN_DIR, extra=()):
    """fairseq-generate's arguments for the en-de test set, beam 5, every sentence (this fairseq
    build drops the last N mod 8 sentences without ``--required-batch-size-multiple 1``)."""
    return [data, "--user-dir", user_dir, "--path", checkpoint, "--cpu", *task_options("ende"),
            "--gen-subset", "test", "--beam", "5", "--required-batch-size-multiple", "1", "--quiet",
            *extra]


# ----------------------------------------------------------------------------------------------
# command lines

def study_train_argv(corpus, data, arch, overrides, settings, seed, save_dir, dim=None, lr=None):
    """fairseq-train's arguments for one run of the study: ``arch`` with its spec's
    ``overrides`` (width templates filled in) at width ``dim``, rate ``lr`` (default: the first
    of ``settings``) and ``seed``, with the budget, shape and schedule of ``settings`` (the
    study's options). A checkpoint_last.pt at every validation lets an interrupted run resume.
    Resuming compares these arguments, so their order is part of a recorded run's identity."""
    from slim_fairseq_lab import specs
    lm = corpus == "wikitext"
    dim = dim or settings.dims[0]
    lr = lr or settings.lrs[0]
    argv = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, "--cpu", "--seed", str(seed),
            "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--max-update", str(settings.max_update), "--max-tokens", str(settings.max_tokens),
            "--validate-interval-updates", str(settings.validate_interval),
            "--save-interval-updates", str(settings.validate_interval), "--keep-interval-updates", "1",
            *adam_options(settings.warmup or max(1, settings.max_update // 10), lr=lr,
                          warmup_init_lr="1e-07", clip_norm="1.0"),
            "--num-workers", "0",
            "--log-format", "json", "--log-interval", str(settings.log_interval or settings.validate_interval),
            "--skip-invalid-size-inputs-valid-test", "--required-batch-size-multiple", "1"]
    if settings.time_budget:
        argv += ["--stop-time-hours", f"{settings.time_budget / 3600.0:.6f}"]
    if settings.max_valid_steps:
        argv += ["--max-valid-steps", str(settings.max_valid_steps)]
    argv += task_options(corpus, settings.tokens_per_sample) + criterion_options(corpus)
    argv += specs.shape_overrides(arch, lm, dim, settings.layers, settings.heads, settings.ffn_mult * dim)
    if settings.dropout is not None and "--dropout" in specs.accepted_flags(arch):
        argv += ["--dropout", str(settings.dropout)]
    return argv + specs.expand_width(overrides, dim)


def study_generate_argv(data, save_dir, bpe_codes):
    """fairseq-generate's arguments for a study run's test BLEU: its checkpoint_best.pt, beam 5,
    hypotheses capped at 1.2 x source + 10 tokens, detokenized sacreBLEU when the BPE codes are
    known (else BPE removed)."""
    extra = ["--max-len-a", "1.2", "--max-len-b", "10", "--max-tokens", "4096", "--scoring", "sacrebleu"]
    if bpe_codes:
        extra += ["--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", bpe_codes]
    else:
        extra += ["--remove-bpe"]
    return translate_test_argv(data, os.path.join(save_dir, "checkpoint_best.pt"), extra=extra)


def ende_comparison_train_argv(data, seed, warmup, max_tokens, max_update, log_interval, model_args,
                               save_dir):
    """fairseq-train's arguments for one model of an en-de comparison (examples/translation/
    *_vs_transformer.sh): ``model_args`` (the shape and the model's own options, its --lr among
    them), the same seed, schedule and batches for both models, one checkpoint kept."""
    return [data, *task_options("ende"), "--cpu", "--seed", str(seed), *adam_options(warmup),
            *criterion_options("ende"), "--max-tokens", str(max_tokens), "--max-update", str(max_update),
            "--no-epoch-checkpoints", "--save-interval-updates", str(max_update),
            "--keep-interval-updates", "1", "--log-format", "simple", "--log-interval", str(log_interval),
            "--num-workers", "0", "--skip-invalid-size-inputs-valid-test", *model_args,
            "--save-dir", save_dir]


def ende_comparison_generate_argv(data, checkpoint, user_dir, extra=()):
    """fairseq-generate's arguments for a model of an en-de comparison: the test set, beam 5,
    BPE removed (fairseq's tokenized BLEU), plus ``extra``. ``--user-dir`` also for fairseq's
    transformer: the plugin allow-lists what fairseq checkpoints hold for torch's weights-only
    loading."""
    return translate_test_argv(data, checkpoint, user_dir, ["--batch-size", "64", "--remove-bpe", *extra])


def lm_comparison_train_argv(data, user_dir, tokens_per_sample, batch_size, max_update, seed, lr,
                             run_args):
    """fairseq-train's arguments for one run of a WikiText-2 comparison (examples/lm/): the run's
    own ``run_args`` (arch, shape, options), the same batches of ``batch_size`` blocks, updates,
    seed and Adam schedule (warm-up a tenth of the updates, gradient clipping 1.0) for every run;
    nothing saved."""
    return [data, "--user-dir", user_dir, "--cpu", "--num-workers", "0",
            *task_options("wikitext", tokens_per_sample), *run_args,
            "--batch-size", str(batch_size), "--max-update", str(max_update), "--seed", str(seed),
            *adam_options(max_update // 10 if max_update >= 10 else 1, lr=lr, clip_norm="1.0"),
            "--no-save", "--log-format", "simple", "--log-interval", "50"]
