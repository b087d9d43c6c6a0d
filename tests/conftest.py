import os
import sys

import pytest
import torch

# stand-ins for the libraries fairseq imports at start and the tests never use, here and in
# every process a test starts (tests/stand_ins/README.md)
STAND_INS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins")
sys.path.insert(0, STAND_INS)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [STAND_INS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~10 s (still runs in CI)")


@pytest.fixture(scope="session", autouse=True)
def _plugin_loaded():
    from helpers import load_plugin
    load_plugin()
