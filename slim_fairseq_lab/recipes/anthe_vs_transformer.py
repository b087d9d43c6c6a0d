"""
Anthe-shaped vs fairseq-transformer-shaped translation on the bundled en-de corpus (CPU).

Both models have the same shape shrunk for a CPU (d 256, f 1024, 4 heads, 3+3 layers),
train for the same number of updates with the same seed, optimizer and batch size, and are
evaluated the same way:
  - anthe:       slim_transformer arch anthe_base (separate embeddings + output bias, GLU,
                 qgv / cross kgv, H-SoftPOS l=2, TC ff .005 + patt .07) at that shape;
  - transformer: fairseq's own `transformer` at that shape with --share-all-embeddings.
Reported per model: parameters, valid loss / nll / PPL (fairseq's masked per-token
perplexity, 2^nll) after the last update, training tokens/s (fairseq's wps), and test BLEU:
fairseq-generate's BLEU4 of the model's checkpoint_last.pt (beam 5, BPE removed), fairseq's
own scorer on Moses tokens (-a), no compound splitting: a tokenized BLEU, not sacreBLEU. A
note under the table says so and names each checkpoint with its update.

usage: anthe_vs_transformer.sh [OUT_DIR] [--max-update N] [--max-tokens N] [--warmup N]
           [--seed S] [--lr LR] [--anthe-lr LR] [--sequential] [--eval-only] [--dry-run]
       Each model trains at the better of the rates measured at this shape (docs/TRAINING.md,
       "Learning rate"): the transformer at 1e-3 (it broke down at 3e-3), Anthe at 3e-3 (far
       better than at 1e-3). --lr sets both models' Adam rate, --anthe-lr Anthe's alone (it
       wins over --lr).
       --eval-only reuses the checkpoints of an earlier run (translate + report only).
       --dry-run prints the two fairseq-train commands and runs nothing.
env:   THREADS (per model, default 1); the two runs go in parallel unless --sequential.
"""
import os
import sys

from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.recipes import cli, tools
from slim_fairseq_lab.recipes.comparisons import EndeComparison, add_run_options, compare_on_bundled_ende

PROG = "anthe_vs_transformer.sh"
SHAPE = ("--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--encoder-layers", "3",
         "--encoder-attention-heads", "4", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024",
         "--decoder-layers", "3", "--decoder-attention-heads", "4", "--dropout", "0.1")


def parser():
    p = cli.Parser(PROG)
    p.value("--max-update", kind="whole", default="600")
    p.value("--max-tokens", kind="whole", default="4096")
    p.value("--warmup", kind="whole", default="200")
    p.value("--seed", kind="whole", default="1")
    p.value("--lr")
    p.value("--anthe-lr")
    add_run_options(p)
    return p


def compare(argv):
    args, _ = cli.split(parser(), argv, ("OUT",))
    # --lr alone sets both rates; without it each model gets its own measured default
    anthe_lr = args.anthe_lr or args.lr or "3e-3"
    lr = args.lr or "1e-3"
    settings = EndeComparison(
        out=args.out or os.path.join(REPO_ROOT, "build", "anthe_vs_transformer"), max_update=int(args.max_update),
        max_tokens=int(args.max_tokens), warmup=int(args.warmup), seed=int(args.seed), log_interval=50, shape=SHAPE,
        threads=os.environ.get("THREADS", "1"), parallel=not args.sequential, dry_run=args.dry_run,
        eval_only=args.eval_only, note=f"lr: {anthe_lr} (anthe) / {lr} (transformer)")
    return compare_on_bundled_ende(settings, [
        ("anthe", ["--user-dir", tools.user_dir(), "--arch", "anthe_base", "--lr", anthe_lr]),
        ("transformer", ["--arch", "transformer", "--share-all-embeddings", "--lr", lr])])


def main(argv=None):
    return cli.run(PROG, __doc__, compare, argv)


if __name__ == "__main__":
    sys.exit(main())
