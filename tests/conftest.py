import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _small_peak_cache(tmp_path_factory):
    """Keep tests off the user's calibration cache; one fixed peak keeps runs fast and stable."""
    os.environ.setdefault("GEMBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
