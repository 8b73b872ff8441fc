"""The wheel holds every package of the tree: pyproject.toml lists them by hand (the repository
root is the package), so a folder added or moved must be listed, or an installed gembench lacks it."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"gembench"} | {
        "gembench." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("harness", "models")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed, f"missing: {sorted(found - listed)}, stale: {sorted(listed - found)}"
