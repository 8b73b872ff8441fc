"""The layers point one way (docs/design.md section 6): import-linter's contracts in pyproject.toml.

The contracts must hold on the repository, and a planted back-edge (a model importing a command)
must break them, so the check is known to look.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path, package_parent: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(LINT.parent), "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_package(parent: Path) -> Path:
    """The repository's sources as a package named gembench under ``parent`` (the checkout's own
    folder name is not the package's, so the checkout itself cannot be linted in place)."""
    shutil.copytree(
        ROOT,
        parent / "gembench",
        ignore=shutil.ignore_patterns(".*", "__pycache__", "results", "docs", "scripts", "*.egg-info", "build"),
    )
    return parent


def test_the_import_contracts_hold(tmp_path):
    parent = _copy_package(tmp_path)
    proc = _lint(parent / "gembench", parent)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_a_planted_back_edge_breaks_them(tmp_path):
    parent = _copy_package(tmp_path)
    config = parent / "gembench" / "models" / "config.py"
    config.write_text(config.read_text() + "\nfrom gembench.harness.commands import run  # planted\n")
    proc = _lint(parent / "gembench", parent)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "gembench.models.config -> gembench.harness.commands.run" in proc.stdout, proc.stdout[-3000:]


def test_a_planted_zoo_import_breaks_the_harness_contract(tmp_path):
    """The harness reads a config only through the protocol: reading the zoo's config module (or
    any module of models/ but the provider entry, models.zoo) is a broken contract."""
    parent = _copy_package(tmp_path)
    runner = parent / "gembench" / "harness" / "train" / "runner.py"
    runner.write_text(runner.read_text() + "\nfrom gembench.models.config import load_config  # planted\n")
    proc = _lint(parent / "gembench", parent)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "gembench.harness.train.runner -> gembench.models.config" in proc.stdout, proc.stdout[-3000:]


def test_the_harness_contract_names_every_module_of_the_zoo_but_its_entry():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (zoo,) = [c for c in contracts if c.get("source_modules") == ["gembench.harness"] and c["type"] == "forbidden"]
    modules = {f"gembench.models.{p.stem}" for p in (ROOT / "models").glob("*.py") if p.stem != "__init__"}
    modules |= {f"gembench.models.{p.name}" for p in (ROOT / "models").iterdir() if (p / "__init__.py").exists()}
    assert set(zoo["forbidden_modules"]) == modules - {"gembench.models.zoo"}


def test_a_planted_argparse_below_the_commands_breaks_them(tmp_path):
    """argparse stays in the cli and the commands: a library module that imports it (to read a
    Namespace instead of its typed config) is a broken contract."""
    parent = _copy_package(tmp_path)
    pairs = parent / "gembench" / "harness" / "continuous" / "pairs.py"
    pairs.write_text(pairs.read_text() + "\nimport argparse  # planted\n")
    proc = _lint(parent / "gembench", parent)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "gembench.harness.continuous.pairs -> argparse" in proc.stdout, proc.stdout[-3000:]
