import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/tiny.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import examples  # noqa: E402,F401  docs/ARCHITECTURE.md's worked methods, registered for the tests only

if os.environ.get("PYTEST_XDIST_WORKER"):   # `pytest -n 2`: a worker a core, one torch thread each (not 2 x 2)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: starting intra-op threads costs far more than the arithmetic (~100x on 2 busy cores).
    A module that wants it says `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
