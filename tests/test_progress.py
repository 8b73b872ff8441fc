"""Progress fits where stderr goes: a rewritten line on a terminal, a few plain lines in a log."""

import io

from gembench.harness.train.progress import LOG_LINES, Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_a_plain_line_per_quarter():
    log = io.StringIO()
    progress = Progress(True, "gembench run tiny", stream=log)
    for done in range(1, 201):
        progress(done, 200, 0.01)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == LOG_LINES, log.getvalue()
    assert lines[-1].startswith("gembench run tiny: step 200/200")


def test_on_a_terminal_one_rewritten_line_ending_with_a_newline():
    tty = Terminal()
    progress = Progress(True, "gembench run tiny", stream=tty)
    for done in range(1, 11):
        progress(done, 10, 0.01)
    text = tty.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and "step 10/10" in text


def test_quiet_prints_nothing():
    log = io.StringIO()
    progress = Progress(False, "x", stream=log)
    for done in range(1, 5):
        progress(done, 4, 0.01)
    assert log.getvalue() == ""


def test_a_long_first_step_ticks_against_the_last_first_step_and_stops_with_it(monkeypatch):
    import time

    from gembench.harness.train.progress import TICK_S

    monkeypatch.setitem(TICK_S, False, 0.02)
    log = io.StringIO()
    progress = Progress(True, "gembench run tiny", stream=log)
    progress.during_first_step("compiling", 90.0)
    time.sleep(0.2)  # the first step, compiling
    progress(1, 4, 0.2)
    ticks = log.getvalue().splitlines()
    time.sleep(0.1)
    assert log.getvalue().splitlines() == ticks  # no tick after the first step ended
    assert len(ticks) >= 3 and all(t.endswith(" s of ~90 s") for t in ticks[:-1]), ticks
    assert ticks[0].startswith("gembench run tiny: compiling, ") and progress.first_step_s == 0.2


def test_the_first_step_is_remembered_per_key_in_the_cache(tmp_path, monkeypatch):
    from gembench.harness.train.progress import first_step_seconds, remember_first_step

    monkeypatch.setenv("GEMBENCH_CACHE", str(tmp_path))
    assert first_step_seconds("tiny|x") is None
    remember_first_step("tiny|x", 41.46)
    remember_first_step("small|x", 90.0)
    assert first_step_seconds("tiny|x") == 41.5 and first_step_seconds("small|x") == 90.0
