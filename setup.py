"""slim_fairseq: parameter-slimming transformers as a fairseq plugin.

torch and fairseq are deliberately not install requirements: a plain ``torch`` requirement
pulls several GB of CUDA packages, and the working fairseq for Python 3.11 is distributed as
``ve-fairseq`` (see README). ``make setup`` installs both with the pins of constraints.txt.
"""
from setuptools import find_packages, setup

setup(
    name="slim_fairseq",
    version="0.2.0",
    description="Anthe, Subformer, STLM weight tying and skipless transformers for fairseq (--user-dir)",
    packages=find_packages(include=["slim_fairseq", "slim_fairseq.*", "slim_fairseq_lab", "slim_fairseq_lab.*"]),
    py_modules=["slim_fairseq_user_dir"],
    python_requires=">=3.10",
    entry_points={"console_scripts": [
        "slim-fairseq-user-dir = slim_fairseq_user_dir:main",
        "slim-fairseq-help = slim_fairseq.arch_help:main",
        "slim-fairseq-export-hf = slim_fairseq.export_hf.cli:main",
    ]},
    license="MIT",
)
