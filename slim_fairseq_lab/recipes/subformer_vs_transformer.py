"""
Shrunk Subformer vs a transformer of the same d_m / L on the bundled en-de corpus (CPU).

Both models: d_m 256, f_m 1024, 4 heads, 4+4 layers, joined dictionary with
--share-all-embeddings, same seed, optimizer, batch size and number of updates.
  - subformer:   slim_transformer arch subformer_small shrunk to that shape: SAFE d_e 128,
                 sandwich middle d_s 384 / f_s 1024 / 6 heads (d_s = 1.5 d_m as in
                 subformer_small), fairseq's default init. The paper's BERT-style init
                 (--bert-init, N(0, 0.02)) stalled a width-128 Subformer on this corpus at
                 9.9 bits (docs/TRAINING.md, "Depth, post-LN and the Subformer"): opt in
                 with --bert-init. Pre-LN, which trained the Subformer best there (same
                 section); --post-ln for the paper's post-LN;
  - transformer: fairseq's own `transformer` at that shape (post-LN; --pre-ln for pre-LN).
Reported per model: parameters, valid loss / nll / PPL (fairseq's masked per-token
perplexity, 2^nll) after the last update, training tokens/s (fairseq's wps), generation
tokens/s (fairseq-generate) and test BLEU: fairseq-generate's BLEU4 of the model's
checkpoint_last.pt (beam 5, BPE removed), fairseq's own scorer on Moses tokens (-a), no
compound splitting: a tokenized BLEU, not sacreBLEU. A note under the table says so and names
each checkpoint with its update.
The Subformer paper reports training 10-30% faster and inference 10-20% faster when
d_s = d_m, slower when d_s >> d_m: add --same-width to run the subformer with d_s = d_m.

usage: subformer_vs_transformer.sh [OUT_DIR] [--max-update N] [--max-tokens N] [--seed S]
           [--log-interval N] [--lr LR] [--subformer-lr LR] [--same-width] [--bert-init]
           [--pre-ln | --post-ln] [--sequential] [--eval-only] [--dry-run]
       default: the Subformer pre-LN, the transformer post-LN (each as it trains best / as
       fairseq ships it); --pre-ln: both pre-LN; --post-ln: both post-LN (the paper's Subformer).
       --dry-run: print the two fairseq-train commands, run nothing. --eval-only: reuse the
       checkpoints of an earlier run (translate + report only). --lr sets both models' Adam
       rate (default 1e-3, the best rate measured nearest this shape for both models:
       docs/TRAINING.md, "Learning rate"), --subformer-lr the Subformer's alone (default:
       --lr); on WikiText-2 the Subformer's best rate differed from the transformer's.
env:   THREADS (per model, default 1); the two runs go in parallel unless --sequential.
"""
import os
import sys

from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.recipes import cli, tools
from slim_fairseq_lab.recipes.comparisons import EndeComparison, add_run_options, compare_on_bundled_ende

PROG = "subformer_vs_transformer.sh"
SHAPE = ("--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--encoder-layers", "4",
         "--encoder-attention-heads", "4", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024",
         "--decoder-layers", "4", "--decoder-attention-heads", "4", "--dropout", "0.1", "--share-all-embeddings")
PRE_LN = ("--encoder-normalize-before", "--decoder-normalize-before")


def parser():
    p = cli.Parser(PROG)
    p.value("--max-update", kind="whole", default="400")
    p.value("--max-tokens", kind="whole", default="4096")
    p.value("--seed", kind="whole", default="1")
    p.value("--log-interval", kind="whole", default="50")
    p.value("--lr", default="1e-3")
    p.value("--subformer-lr")
    p.flag("--same-width", default=False)
    p.flag("--bert-init", default=False)
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--pre-ln", action="store_const", const="pre", dest="norm")
    norm.add_argument("--post-ln", action="store_const", const="post", dest="norm")
    add_run_options(p)
    return p


def compare(argv):
    args, _ = cli.split(parser(), argv, ("OUT",))
    max_update = int(args.max_update)
    middle = (["--sandwich-dim", "256", "--sandwich-ffn-dim", "1024", "--sandwich-heads", "4"] if args.same_width
              else ["--sandwich-dim", "384", "--sandwich-ffn-dim", "1024", "--sandwich-heads", "6"])
    subformer_norm = [] if args.norm == "post" else list(PRE_LN)
    transformer_norm = list(PRE_LN) if args.norm == "pre" else []
    subformer_lr = args.subformer_lr or args.lr
    settings = EndeComparison(
        out=args.out or os.path.join(REPO_ROOT, "build", "subformer_vs_transformer"), max_update=max_update,
        max_tokens=int(args.max_tokens), warmup=max_update // 2 if max_update < 400 else 200, seed=int(args.seed),
        log_interval=int(args.log_interval), shape=SHAPE,
        # a stalled model repeats itself: cap the hypotheses' length
        generate_args=("--max-len-a", "1.2", "--max-len-b", "10"), threads=os.environ.get("THREADS", "1"),
        parallel=not args.sequential, dry_run=args.dry_run, eval_only=args.eval_only,
        note=f"lr: {subformer_lr} (subformer) / {args.lr} (transformer)")
    return compare_on_bundled_ende(settings, [
        ("subformer", ["--user-dir", tools.user_dir(), "--arch", "subformer_small", "--safe-embed-dim", "128", *middle,
                       *(["--bert-init"] if args.bert_init else []), *subformer_norm, "--lr", subformer_lr]),
        ("transformer", ["--arch", "transformer", *transformer_norm, "--lr", args.lr])])


def main(argv=None):
    return cli.run(PROG, __doc__, compare, argv)


if __name__ == "__main__":
    sys.exit(main())
