"""`python -m bench SUBCOMMAND`: see bench/cli.py and BENCHMARKS.md."""

import sys

from bench.cli import main

sys.exit(main())
