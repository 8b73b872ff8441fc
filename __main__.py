from gembench.harness.cli import entry

entry()
