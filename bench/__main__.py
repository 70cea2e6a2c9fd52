"""Entry point: ``python -m bench [options]`` (see ``bench/run.py`` and ``docs/benchmarks.md``)."""

from __future__ import annotations

import sys

from bench.run import main

if __name__ == "__main__":
    sys.exit(main())
