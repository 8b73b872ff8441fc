"""Third-party log noise kept off the terminal (every command's log records, a rank's warnings too);
`--verbose` shows it.

A `--nproc` run printed, among its tables, lines that are not for the user to act on. Each
comes from a different place, so each is caught where it is made:

* TorchRec's planner logs through `logging` ("The topology was constructed directly ...",
  "There is a known issue with TorchRec's dense tensor size calculation ..."): a handler on the
  library loggers keeps records below ERROR (errors still reach stderr);
* Python warnings raised in torch / TorchRec / fbgemm (FutureWarnings of deprecated c10d calls,
  the planner's storage reservation): warnings.showwarning keeps those not raised by gembench;
* kineto's C++ "USDT: ... profiler_start" / "profiler_stop" lines, written straight to file
  descriptor 2 when torch.profiler starts and stops, are dropped where the profiler is made
  (harness/metrics/trace.py: profiler), for single-process and distributed runs alike.

What is kept is counted in HIDDEN; rank 0 says how many lines it kept back.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

LIBRARY_LOGGERS = ("torchrec", "fbgemm_gpu", "torch.distributed", "torch.fx")  # torch.fx: is_fx_tracing's
HIDDEN: list[str] = []  # the messages kept off the terminal, in order
_OWN = Path(__file__).resolve().parents[2]  # the gembench package root


class _Keep(logging.Handler):
    """Keeps library records below ERROR; passes errors on to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            logging.lastResort.handle(record)
        else:
            HIDDEN.append(f"{record.levelname}:{record.name}:{record.getMessage()}")


def _show_warning(message, category, filename, lineno, file=None, line=None, _original=warnings.showwarning):
    try:
        path = Path(filename).resolve()
        ours = path.is_relative_to(_OWN) and "site-packages" not in path.parts
    except (OSError, ValueError):
        ours = False
    if ours:
        _original(message, category, filename, lineno, file, line)
    else:
        HIDDEN.append(warnings.formatwarning(message, category, filename, lineno, line).strip())


def install_logging(verbose: bool) -> None:
    """Keep library log records below ERROR off the terminal (no-op with --verbose): every command
    (the CLI installs it), so TorchRec's and torch's notices reach no user who cannot act on them."""
    if verbose:
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _Keep) for h in logger.handlers):
            logger.addHandler(_Keep())
        logger.propagate = False


def install(verbose: bool) -> None:
    """install_logging, and library warnings kept too (a rank's process). Call before importing
    TorchRec, whose import may warn too."""
    install_logging(verbose)
    if not verbose:
        warnings.showwarning = _show_warning


def hidden_note(rank: int) -> str | None:
    if not HIDDEN:
        return None
    return (
        f"rank {rank} kept {len(HIDDEN)} library message(s) off the terminal (TorchRec planner and "
        "deprecation warnings, profiler lines); --verbose shows them"
    )
