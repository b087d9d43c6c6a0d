#!/usr/bin/env bash
# One device call: make gpu-check, then stlm_tied against transformer_lm at d 512 in fp16
# with 8,192 and 32,768 tokens per training step (scripts/benchmark.py, 5 repetitions).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 3
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/nvidia-smi.txt 2>&1
python3 -c "import torch, numpy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'python', sys.version.split()[0])" > $OUT/env.txt 2>&1
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null || true
timeout 420 python3 scripts/gpu_check.py --budget 380 --out $OUT/gpu-check > $OUT/gpu-check.log 2>&1
echo "gpu_check rc=$?"
LM=build/test-data/wikitext2_lines1500_vocab2000/data-bin
EN=build/test-data/ende_bpe1000_train1500_eval100/data-bin
for tok in 8192 32768; do
  timeout 60 python3 scripts/benchmark.py --device cuda --out $OUT/lm-tokens$tok --dim 512 --layers 6 --heads 8 \
    --dtype fp16 --model stlm_tied --model "transformer_lm_prenorm=transformer_lm --decoder-normalize-before" \
    --max-tokens $tok --tokens-per-sample 512 --num-batches 2 --steps 3 --repeats 5 \
    --no-generation --lm-data $LM --ende-data $EN > $OUT/lm-tokens$tok.log 2>&1
  echo "tokens $tok rc=$?"
done
grep -v "INFO" $OUT/gpu-check.log | tail -c 3000
tail -n 12 $OUT/lm-tokens*/table.md 2>/dev/null
