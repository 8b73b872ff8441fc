"""Reading the TOML files users write (configs, thresholds), with errors that name the file."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gembench.harness.errors import UsageError


def read_toml(path: Path, missing: str) -> dict:
    """Parse ``path``; a missing file raises UsageError(``missing``), bad TOML names the file."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(missing) from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML: {err}") from None
