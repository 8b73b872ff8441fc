"""Makes this interpreter look like asv's benchmark environment to the asv suite.

asv builds an environment from asv.conf.json's matrix and installs gembench with --no-deps, so
what gembench's .venv has beyond that matrix (pytest and the other test tools, matplotlib,
jsonschema) is missing there. tests/test_asv.py puts this folder on the benchmark processes'
PYTHONPATH (asv's ASV_PYTHONPATH) with GEMBENCH_ASV_ABSENT naming those modules; importing one
then fails as it would under `asv run`, and `asv check --python=same` catches it here.
"""

import importlib.abc
import os

ABSENT = {m for m in os.environ.get("GEMBENCH_ASV_ABSENT", "").split(",") if m}


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named '{name}' (not in asv's environment: see asv.conf.json's matrix)",
                                      name=name)
        return None


if ABSENT:
    import sys

    sys.meta_path.insert(0, _Absent())
