"""Export to Hugging Face transformers (README, "Use your model outside fairseq").

A trained ``slim_lm`` / ``slim_transformer`` (or fairseq's own ``transformer_lm`` /
``transformer``) checkpoint becomes a folder that ``AutoModelForCausalLM`` /
``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load with no network, giving fairseq's
log-probabilities: ``LlamaForCausalLM`` (the STLM block), ``XGLMForCausalLM`` (pre-norm,
sinusoidal positions), ``OPTForCausalLM`` (post-norm, learned positions, projections),
``FSMTForConditionalGeneration`` (post-norm translation), ``M2M100ForConditionalGeneration``
(pre-norm translation with one vocabulary); skipless language models and those with Anthe's
gates or H-SoftPOS leave as transformers custom code, ``SlimForCausalLM`` (:mod:`.custom`,
loaded with ``trust_remote_code=True``); Tensor-Chain models are materialised first.

This package is the only part of the plugin that imports ``transformers``, and only when an
export runs. One module per target layout (:mod:`.llama`, :mod:`.xglm`, :mod:`.opt`,
:mod:`.fsmt`, :mod:`.m2m100`; custom code: :mod:`.skipless`, :mod:`.anthe`), the choice and
refusals (:mod:`.support`), the tokenizer (:mod:`.tokenizer`), the self-check (:mod:`.check`)
and the model card (:mod:`.card`).
"""
from slim_fairseq.export_hf.export import ExportResult, export  # noqa: F401
