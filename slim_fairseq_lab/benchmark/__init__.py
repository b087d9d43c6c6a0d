"""The speed, memory and size benchmark behind scripts/benchmark.py: measurements of one model
(:mod:`~slim_fairseq_lab.benchmark.measure`), the benchmark's steps (:mod:`~.run`), its report and
plots."""

#: parameter names under these modules count as embedding parameters: token tables, positions,
#: H-SoftPOS / SAFE input and output paths, the vocabulary projection
EMBEDDING_PARTS = ("embed_tokens", "embed_positions", "output_projection", "adaptive_softmax")

#: the --dtype choices: fp32, or bf16 / fp16 (autocast in training, model cast for generation)
DTYPE_NAMES = ("fp32", "bf16", "fp16")
