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
