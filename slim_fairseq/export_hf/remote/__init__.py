"""The transformers custom code an export writes into OUT_DIR beside the plugin's own module
files (:mod:`slim_fairseq.export_hf.custom`): ``configuration_slim.py`` and
``modeling_slim.py``. They import those module files relatively (``from .rope import ...``),
so they run only inside OUT_DIR, loaded with ``trust_remote_code=True``; the plugin never
imports them."""
