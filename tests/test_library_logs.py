"""Library noise kept off the terminal (harness/train/distributed/library_logs.py), without starting ranks."""

import logging
import warnings

import pytest

from gembench.harness.train.distributed import library_logs


@pytest.fixture
def hidden(monkeypatch):
    monkeypatch.setattr(library_logs, "HIDDEN", [])
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    for name in library_logs.LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    return library_logs.HIDDEN


def test_library_logging_and_warnings_are_kept_errors_are_not(hidden, capfd):
    library_logs.install(verbose=False)
    logging.getLogger("torchrec.distributed.planner.types").warning("The topology was constructed directly")
    logging.getLogger("torchrec.x").error("a real error")
    warnings.warn_explicit("deprecated", FutureWarning, "/x/site-packages/torch/distributed/c10d_logger.py", 83)
    err = capfd.readouterr().err
    assert "topology" not in err and "deprecated" not in err and "a real error" in err
    assert len(library_logs.HIDDEN) == 2 and "rank 0 kept 2 library message(s)" in library_logs.hidden_note(0)
