"""Mistakes a user can fix: the one exception type, and reading the TOML files users write.

The bottom layer (docs/design.md section 6): models and harness alike may import it; it imports
nothing of gembench. Anything raised as a UsageError reaches the user as a single line
``gembench: error: ...`` and exit status 2, with no traceback. The message must name the file,
field, flag or rank at fault and say what to do.
"""

from __future__ import annotations

from pathlib import Path

import tomllib


class UsageError(Exception):
    """A mistake in the user's input: bad flag, bad config, unwritable path, too-large model."""

    exit_code = 2


def read_toml(path: Path, missing: str) -> dict:
    """Parse ``path`` (a config, thresholds); a missing file raises UsageError(``missing``), bad
    TOML names the file."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(missing) from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML: {err}") from None
