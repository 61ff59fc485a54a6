"""``python -m disagg.sim ARGS`` == ``disagg sim ARGS``."""

import sys

from .main import run

sys.exit(run(sys.argv[1:]))
