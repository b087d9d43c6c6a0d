"""
Perplexity of a language model with fairseq-eval-lm: fairseq's masked per-token perplexity
(2^loss, loss in bits per token, padding excluded). The Anthe reference code's perplexities
averaged over padding positions too; they are not comparable with these.

CKPT is a checkpoint file or a checkpoint folder (its checkpoint_best.pt, or with --avg N the
average of its last N checkpoints, named in the log). The subset is cut into blocks of
--tokens-per-sample tokens; each block scores its last tokens with the --context-window
tokens before them as context (fairseq's adaptive-input WikiText-103 evaluation: 3072 / 2560).
Defaults follow the checkpoint: --tokens-per-sample is the block the model was trained on (its
task's tokens_per_sample; the model's positions when the checkpoint records none; the log
says which), --context-window 5/6 of it (3072 -> 2560, as fairseq's setting), --max-tokens
one block. Blocks hold complete lines (--sample-break-mode complete, fairseq's protocol); a
line longer than the model's positions cannot be scored that way: --sample-break-mode none
lets blocks cross line boundaries.

Only a verified result reaches stdout: "SUBSET: Loss (base 2): L, Perplexity: P (N tokens ...)"
when fairseq-eval-lm scored every token of the subset. fairseq's own log goes to
CKPT_NAME.SUBSET.eval-lm.log next to the checkpoint (progress on stderr); the result also to
CKPT_NAME.SUBSET.results.txt (one file per model and subset). Both are written only when a run
succeeds: a refused or failed run leaves those of an earlier one as they were (a failed run's
log stays in the temporary folder its error names). The
script fails, printing no perplexity, when fairseq-eval-lm fails, skips blocks longer than the
model's positions, or evaluates fewer (or more) tokens than the subset holds; blocks longer
than the model's positions and shards of the subset (--num-shards) are refused before it runs,
and so are translation data or a translation model (examples/translation/evaluate.sh scores
those) and a checkpoint that is not complete.

usage: evaluate-lm.sh DATA_BIN CKPT [--avg N] [--subset test] [--tokens-per-sample N]
           [--context-window N] [--max-tokens N] [--sample-break-mode complete|none|eos]
           [--cpu] [fairseq-eval-lm options]
       (--name=VALUE is the same as --name VALUE; --gen-subset is --subset)
"""
import os
import re
import sys

from slim_fairseq_lab import checkpoints
from slim_fairseq_lab.recipes import cli, evaluation, text, tools
from slim_fairseq_lab.recipes.cli import OptionError, log, refuse, step_failed
from slim_fairseq_lab.recipes.outputs import Staged

PROG = "evaluate-lm.sh"


def parser():
    p = cli.Parser(PROG)
    p.value("--avg", kind="count", default="1")
    p.value("--subset", "--gen-subset", dest="subset", default="test")
    p.value("--tokens-per-sample", kind="count")
    p.value("--context-window", kind="whole")
    p.value("--max-tokens", kind="count")
    p.value("--sample-break-mode", kind="choice:complete|none|eos|complete_doc")
    p.value("--num-shards", kind="count", default="1")
    p.flag("--cpu", default=False)
    p.refused("--shard-id", "evaluate-lm.sh scores the whole subset",
              "no --shard-id (fairseq-eval-lm itself scores a shard)")
    p.refused("--path", "the checkpoint is CKPT, the second argument", "evaluate-lm.sh DATA_BIN CKPT")
    p.refused("--max-valid-steps", "evaluate-lm.sh scores the whole subset", "no --max-valid-steps")
    p.refused("--distributed-world-size", "evaluate-lm.sh runs one process (several would each score "
              "a shard)", "no --distributed-world-size")
    return p


def blocks(tokens_per_sample, context_window, max_tokens, positions):
    """The checks of a block length: the refusal of the first that fails, or None."""
    if tokens_per_sample > positions:
        return refuse(f"--tokens-per-sample={tokens_per_sample}", f"the model accepts at most {positions} "
                      "positions", f"--tokens-per-sample {positions} or less")
    if context_window >= tokens_per_sample:
        return refuse(f"--context-window={context_window}", "not smaller than --tokens-per-sample "
                      f"{tokens_per_sample}", f"--context-window {tokens_per_sample - 1} or less")
    if max_tokens < tokens_per_sample:
        return refuse(f"--max-tokens={max_tokens}", f"less than one block of --tokens-per-sample "
                      f"{tokens_per_sample} tokens", f"--max-tokens {tokens_per_sample} or more")
    return None


def evaluate_lm(argv):
    args, extra = cli.split(parser(), argv, ("DATA_BIN", "CKPT"), pass_through=True)
    data, ckpt, subset = args.data_bin, args.ckpt, args.subset
    if not (data and ckpt):
        raise refuse("DATA_BIN and CKPT", "required", "evaluate-lm.sh DATA_BIN CKPT (see --help)")
    if ":" in data:
        raise refuse(f"DATA_BIN={data}", "shards of a data-bin (fairseq's DIR1:DIR2)", f"one data-bin, e.g. "
                     f"{data.split(':')[0]} (evaluate-lm.sh scores a whole subset; run fairseq-eval-lm itself on "
                     "each shard)")
    if not os.path.isdir(data):
        raise refuse(f"DATA_BIN={data}", "not a folder", "the data-bin of a prepare script (or fairseq-preprocess "
                     "--only-source)")
    if args.num_shards != "1":
        raise refuse(f"--num-shards={args.num_shards}", "evaluate-lm.sh scores the whole subset, not a shard "
                     "of it", "no --num-shards (fairseq-eval-lm itself scores a shard)")
    pairs = sorted(f for f in os.listdir(data) if re.fullmatch(r"dict\.[^.]+\.txt", f))
    if pairs and not os.path.isfile(os.path.join(data, "dict.txt")):
        raise refuse(f"DATA_BIN={data}", f"translation data ({', '.join(pairs)}), and evaluate-lm.sh scores "
                     "language models", "examples/translation/evaluate.sh DATA_BIN CKPT")
    tools.find("fairseq-eval-lm")
    sizes = text.subset_tokens(data, subset)
    if sizes is None:
        sets = sorted(name[:-len(".idx")] for name in os.listdir(data) if name.endswith(".idx"))
        raise refuse(f"--subset={subset}", f"no binarized {subset} set in {data} (no readable {subset}.idx)",
                     "|".join(sets) if sets else "a data-bin written by fairseq-preprocess")
    subset_tokens, longest = sizes
    eval_dir = os.path.join(evaluation.folder_of(ckpt), "eval")
    stem = evaluation.checkpoint_name(ckpt, int(args.avg), eval_dir)
    stem = (stem[:-len(".pt")] if stem.endswith(".pt") else stem) + f".{subset}"
    log_path, results_path = f"{stem}.eval-lm.log", f"{stem}.results.txt"
    model = evaluation.resolve(ckpt, args.avg, eval_dir)
    state = model.state
    if checkpoints.task_name(state) == "translation":
        raise refuse(f"CKPT={model.averaged[-1] if model.averaged else model.path}",
                     f"a translation model ({evaluation.describe(state)}), and evaluate-lm.sh scores language "
                     "models", "examples/translation/evaluate.sh DATA_BIN CKPT")
    evaluation.check_data(model, data)

    # the model's positions and the block it was trained on
    positions = checkpoints.max_positions(state)
    if positions is None:
        raise refuse(f"CKPT={model.path}", "its settings give no number of positions",
                     "a checkpoint written by fairseq-train")
    training_block = checkpoints.training_block(state)
    if args.tokens_per_sample:
        tokens_per_sample, source = int(args.tokens_per_sample), "--tokens-per-sample"
    elif training_block is not None and training_block <= positions:
        tokens_per_sample = training_block
        source = "the training block: tokens_per_sample of the checkpoint's task"
    else:
        tokens_per_sample = positions
        source = "the model's positions: the checkpoint records no usable training block"

    def context_for(tokens):
        return int(args.context_window) if args.context_window is not None else tokens - tokens // 6

    def max_tokens_for(tokens):
        return int(args.max_tokens) if args.max_tokens else tokens

    context_window, max_tokens = context_for(tokens_per_sample), max_tokens_for(tokens_per_sample)
    problem = blocks(tokens_per_sample, context_window, max_tokens, positions)
    if problem:
        raise problem
    notes = []
    mode = args.sample_break_mode
    if mode is None and longest <= tokens_per_sample:
        mode = "complete"
    elif mode is None:
        mode = "none"
        notes.append(f"the longest line of {subset} holds {longest} tokens, more than a block of {tokens_per_sample}: "
                     "blocks cross line boundaries (--sample-break-mode none)")
    elif mode == "complete" and longest > tokens_per_sample:
        # a longer block is a suggestion only when every other check accepts it
        longer = next((t for t in range(longest, positions + 1)
                       if blocks(t, context_for(t), max_tokens_for(t), positions) is None), None)
        allowed = "--sample-break-mode none (blocks cross lines)"
        if longer is not None:
            allowed += f", or --tokens-per-sample {longer} or more (the model has {positions} positions)"
        raise OptionError(f"--sample-break-mode complete: the longest line of {subset} holds {longest} tokens, "
                          f"more than a block of --tokens-per-sample {tokens_per_sample}; allowed: {allowed}")

    with Staged(PROG) as stage:
        fairseq_model = model.path
        if model.averaged:
            fairseq_model = stage.path(os.path.basename(model.path))
            model.write_average(fairseq_model)
        for note in notes:
            log(note)
        log(f"evaluating {model.path} on {subset} ({subset_tokens} tokens): blocks of {tokens_per_sample} tokens "
            f"({source}; {mode}), context window {context_window} (model positions: {positions}"
            + (f", training block: {training_block}" if training_block is not None else "")
            + f"); fairseq's log: {log_path}")
        staged_log = stage.path("eval-lm.log")
        # --softmax-batch: the adaptive softmax scores the vocabulary in chunks; batch multiple 1:
        # with the default (8) this fairseq build silently drops the last blocks of the subset;
        # world size 1: fairseq's default (every visible GPU) would score one shard of the
        # subset per GPU
        tools.run(["fairseq-eval-lm", data, "--user-dir", tools.user_dir(), "--path", fairseq_model,
                   "--task", "language_modeling", "--gen-subset", subset, "--sample-break-mode", mode,
                   "--tokens-per-sample", tokens_per_sample, "--context-window", context_window,
                   "--max-tokens", max_tokens, "--softmax-batch", "1024", "--required-batch-size-multiple", "1",
                   "--distributed-world-size", "1", *(["--cpu"] if args.cpu else []), *extra],
                  log=staged_log, progress=lambda: log(f"fairseq-eval-lm on {subset}: running"))
        with open(staged_log, encoding="utf-8", errors="replace") as f:
            output = f.read()
        skipped = re.search(r"([0-9,]+) samples have invalid sizes and will be skipped", output)
        if skipped:
            raise step_failed(f"fairseq-eval-lm skipped {skipped.group(1)} blocks longer than the model's positions "
                              f"({positions}): no perplexity of the whole {subset} set; lower --tokens-per-sample "
                              f"(now {tokens_per_sample}) and --context-window (now {context_window}), or pass "
                              f"--sample-break-mode none (now {mode}) when single lines are longer")
        evaluated = re.findall(r"Evaluated ([0-9,]+) tokens", output)
        evaluated = int(evaluated[-1].replace(",", "")) if evaluated else 0
        if evaluated <= 0:
            raise step_failed(f"fairseq-eval-lm evaluated no tokens of {subset}: check --tokens-per-sample (now "
                              f"{tokens_per_sample}), --context-window (now {context_window}) and --max-tokens "
                              f"(now {max_tokens}) (see {staged_log})")
        if evaluated != subset_tokens:
            raise step_failed(f"fairseq-eval-lm evaluated {evaluated} tokens, but {subset} holds {subset_tokens}: no "
                              f"perplexity of the whole {subset} set (options passed to fairseq-eval-lm: "
                              f"{' '.join(extra) or 'none'}; see {staged_log})")
        result = re.findall(r"Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+", output)
        if not result:
            raise step_failed(f"fairseq-eval-lm reported no perplexity (see {staged_log})")
        line = (f"{subset}: {result[-1]} ({evaluated} tokens; fairseq's masked per-token perplexity; blocks of "
                f"{tokens_per_sample}, context {context_window})\n")
        with open(stage.path("results.txt"), "w", encoding="utf-8") as f:
            f.write(line)
        if model.averaged:
            stage.install(os.path.basename(model.path), model.path)
        stage.install("eval-lm.log", log_path)
        stage.install("results.txt", results_path)
    sys.stdout.write(line)
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, evaluate_lm, argv)


if __name__ == "__main__":
    sys.exit(main())
