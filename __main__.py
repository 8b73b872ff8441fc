import sys

from gembench.harness.cli import main

sys.exit(main())
