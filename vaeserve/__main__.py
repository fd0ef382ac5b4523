"""``python -m vaeserve ...`` is the ``vaeserve`` command (handy before the console script is on PATH)."""

import sys

from vaeserve.service.cli import main

sys.exit(main())
