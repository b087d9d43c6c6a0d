"""Exports as transformers custom code: OUT_DIR carries ``configuration_slim.py`` and
``modeling_slim.py`` (:mod:`slim_fairseq.export_hf.remote`, the composition only) and, copied
byte for byte, the plugin's module files that hold each technique's maths (:data:`MODULES`:
plain torch, the files the fairseq model runs), with ``auto_map`` in config.json;
users load it with ``trust_remote_code=True``.

The maths is written once: a fix to a technique's file is a fix to the fairseq model and to
every later export (tests/test_export_custom.py fails if an exported file differs from the
plugin's or if the modeling file computes a technique itself).
"""
import os
import shutil

from slim_fairseq.modules import (adaptive_softmax_function, gate_function, glu_function,
                                  hsoftpos_function, rmsnorm, rope, safe_function,
                                  shaped_attention, skipless_block)

# the plugin's module files that ``modeling_slim.py`` imports: plain torch, copied byte for byte
MODULES = (rope, shaped_attention, skipless_block, glu_function, gate_function, hsoftpos_function,
           safe_function, adaptive_softmax_function, rmsnorm)
REMOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote")
CODE_FILES = ("configuration_slim.py", "modeling_slim.py")
CONFIG_CLASS = "configuration_slim.SlimConfig"


def module_files(layout=None):
    """Paths of the plugin's module files that the exported code imports."""
    return [os.path.abspath(module.__file__) for module in MODULES]


def write_code(layout, folder):
    """Copy the custom-code files and the layout's module files into ``folder``."""
    for name in CODE_FILES:
        shutil.copyfile(os.path.join(REMOTE, name), os.path.join(folder, name))
    for path in module_files(layout):
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def auto_map(layout):
    return {"AutoConfig": CONFIG_CLASS, layout.AUTO: f"modeling_slim.{layout.CLASS}"}


def instantiate(layout, values, folder):
    """``(config, model class)`` from the code written in ``folder`` (loaded as transformers
    loads custom code), the config built from ``values``."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    config_class = get_class_from_dynamic_module(CONFIG_CLASS, folder, local_files_only=True)
    model_class = get_class_from_dynamic_module(f"modeling_slim.{layout.CLASS}", folder,
                                                local_files_only=True)
    config = config_class(**values)
    config.auto_map = auto_map(layout)
    config.architectures = [layout.CLASS]
    return config, model_class
