"""Library noise kept off the terminal (harness/distributed/noise.py), without starting ranks."""

import logging
import os
import warnings

import pytest

from gembench.harness.distributed import noise


@pytest.fixture
def hidden(monkeypatch):
    monkeypatch.setattr(noise, "HIDDEN", [])
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    for name in noise.LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    return noise.HIDDEN


def test_c_level_prints_to_fd_2_are_kept_unless_verbose(hidden, capfd):
    with noise.muted_fd2(verbose=False):
        os.write(2, b"USDT: profiler_start\n")  # as kineto's C++ does, below Python's sys.stderr
    with noise.muted_fd2(verbose=True):
        os.write(2, b"USDT: profiler_stop\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" in err
    assert noise.HIDDEN == ["USDT: profiler_start"]


def test_what_was_printed_comes_back_when_the_call_fails(hidden, capfd):
    with pytest.raises(RuntimeError), noise.muted_fd2(verbose=False):
        os.write(2, b"kineto: cannot start\n")
        raise RuntimeError("profiler failed")
    assert "kineto: cannot start" in capfd.readouterr().err


def test_library_logging_and_warnings_are_kept_errors_are_not(hidden, capfd):
    noise.install(verbose=False)
    logging.getLogger("torchrec.distributed.planner.types").warning("The topology was constructed directly")
    logging.getLogger("torchrec.x").error("a real error")
    warnings.warn_explicit("deprecated", FutureWarning, "/x/site-packages/torch/distributed/c10d_logger.py", 83)
    err = capfd.readouterr().err
    assert "topology" not in err and "deprecated" not in err and "a real error" in err
    assert len(noise.HIDDEN) == 2 and "rank 0 kept 2 library message(s)" in noise.hidden_note(0)
