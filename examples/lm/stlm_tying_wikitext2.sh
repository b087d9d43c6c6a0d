#!/usr/bin/env bash
# STLM weight tying on the bundled WikiText-2 (docs/TECHNIQUES.md#tying-schemes), shrunk for CPU.
#
# Three runs at a matched parameter budget (~2.06M with the 8000-word vocabulary), same
# updates, batches and seed:
#   tied    tied in/out baseline            D 6, H 128, F 344
#   ffn     FFN tying over all interior     D 6, H 160, F 414   (--tie-ffn 0, wider)
#   lora    FFN tying + per-layer LoRA r=8  D 6, H 160, F 352   (--tie-ffn 0 --ffn-lora-rank 8)
# 8 query / 2 KV heads everywhere. Prints parameters, valid perplexity and training tokens/s.
#
# Usage: bash examples/lm/stlm_tying_wikitext2.sh [OUT_DIR]
# Environment: UPDATES (300), BATCH (8 sequences), TOKENS (128 per sequence), LR (2e-3),
#   SEED (1), JOBS (parallel runs, 2), NWORDS (vocabulary cap, 8000), RUNS ("tied ffn lora").
#   DRY_RUN=1 prints the fairseq-train commands and trains nothing.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-${FAIRSEQ_BIN:-$HERE/../../.venv/bin}/python}
# shellcheck source=SCRIPTDIR/../common.sh
. "$HERE/../common.sh"
OUT=""
OPTIONS=("@positional OUT")
parse_options "${OPTIONS[@]}" -- "$@"
OUT=${OUT:-$REPO_ROOT/build/stlm_tying_wikitext2}
UPDATES=${UPDATES:-300}
BATCH=${BATCH:-8}
TOKENS=${TOKENS:-128}
LR=${LR:-2e-3}
SEED=${SEED:-1}
JOBS=${JOBS:-2}
NWORDS=${NWORDS:-8000}
RUNS=${RUNS:-"tied ffn lora"}

MODEL="--arch stlm_tied --decoder-layers 6 --decoder-attention-heads 8 --kv-heads 2"
lm_run_args() {
  case "$1" in
    tied) echo "$MODEL --decoder-embed-dim 128 --decoder-ffn-embed-dim 344" ;;
    ffn)  echo "$MODEL --decoder-embed-dim 160 --decoder-ffn-embed-dim 414 --tie-ffn 0" ;;
    lora) echo "$MODEL --decoder-embed-dim 160 --decoder-ffn-embed-dim 352 --tie-ffn 0 --ffn-lora-rank 8 --ffn-lora-alpha 16" ;;
    *) return 1 ;;
  esac
}
LM_TRAIN_ARGS=(--weight-decay 0.01)

compare_lms_on_wikitext2
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0

# Training throughput per CPU-second (process time, one thread): less sensitive than the
# wall-clock tokens/s above to other processes sharing the machine.
for name in $RUNS; do
  # shellcheck disable=SC2046
  STLM_USER_DIR="$(slim_user_dir)" "$PYTHON" - "$LM_DATA" "$TOKENS" "$BATCH" "$name" $(lm_run_args "$name") \
      <<'PY' 2>>"$OUT/bench.err"
import argparse, os, sys, time
import torch
from fairseq import options, tasks, utils

data, tokens, batch, name, model_args = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
torch.set_num_threads(1)
utils.import_user_module(argparse.Namespace(user_dir=os.environ["STLM_USER_DIR"]))
args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
    data, "--task", "language_modeling", "--tokens-per-sample", str(tokens), "--cpu", *model_args])
task = tasks.setup_task(args)
torch.manual_seed(1)
model = task.build_model(args).train()
sample = torch.randint(task.dictionary.nspecial, len(task.dictionary), (batch, tokens))

def step():
    logits = model(sample)[0]
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), sample.reshape(-1)).backward()

for _ in range(2):
    step()
start = time.process_time()
for _ in range(8):
    step()
rate = 8 * sample.numel() / (time.process_time() - start)
print(f"{name:6s} train tokens per CPU-second: {rate:,.0f}")
PY
done | tee -a "$OUT/summary.txt"
