#!/usr/bin/env bash
# Second device call: the LM batch runs, then the benchmark stage of the device check alone
# (scripts/benchmark.py with the attention FLOP formulas); tables copied to the top of $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 3
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1
LM=build/test-data/wikitext2_lines1500_vocab2000/data-bin
EN=build/test-data/ende_bpe1000_train1500_eval100/data-bin
for tok in 8192 32768; do
  timeout 70 python3 scripts/benchmark.py --device cuda --out $OUT/lm-tokens$tok --dim 512 --layers 6 --heads 8 \
    --dtype fp16 --model stlm_tied --model "transformer_lm_prenorm=transformer_lm --decoder-normalize-before" \
    --max-tokens $tok --tokens-per-sample 512 --num-batches 2 --steps 3 --repeats 5 \
    --no-generation --lm-data $LM --ende-data $EN > $OUT/lm-tokens$tok.log 2>&1
  echo "tokens $tok rc=$?"
  mv $OUT/lm-tokens$tok/table.md $OUT/lm-tokens$tok-table.md; mv $OUT/lm-tokens$tok/results.json $OUT/lm-tokens$tok-results.json
done
tail -n 8 $OUT/lm-tokens*-table.md
timeout 240 python3 scripts/gpu_check.py --stages benchmark --budget 200 --out $OUT/gpu-check > $OUT/gpu-check.log 2>&1
echo "gpu_check rc=$?"
for d in $OUT/gpu-check/benchmark/*/; do n=$(basename $d); cp $d/table.md $OUT/bench-$n-table.md 2>/dev/null; cp $d/results.json $OUT/bench-$n-results.json 2>/dev/null; done
cp $OUT/gpu-check/benchmark/*.log $OUT/ 2>/dev/null
rm -rf $OUT/gpu-check/benchmark $OUT/lm-tokens8192 $OUT/lm-tokens32768
grep -v "INFO" $OUT/gpu-check.log | tail -c 1500
