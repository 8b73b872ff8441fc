import os
from pathlib import Path

import pytest
import torch

# Triton's interpreter runs the GPU kernels on CPU tensors (tests/test_hstu_triton.py). Triton fixes
# interpreted vs compiled when it is first imported (torchrec imports it), so this comes first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _small_peak_cache(tmp_path_factory):
    """Keep tests off the user's calibration cache; one fixed peak keeps runs fast and stable."""
    os.environ.setdefault("GEMBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
