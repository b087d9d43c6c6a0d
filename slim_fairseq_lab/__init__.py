"""slim_fairseq_lab: the study, benchmark and device-check tooling behind ``scripts/``.

The plugin (:mod:`slim_fairseq`) never imports this package; the scripts under ``scripts/`` are
thin command-line front ends over its modules.
"""
