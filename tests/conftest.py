import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~10 s (still runs in CI)")


@pytest.fixture(scope="session", autouse=True)
def _plugin_loaded():
    from helpers import load_plugin
    load_plugin()
