"""``python -m service ...`` is ``vaeserve ...`` (handy before the package is installed)."""

import sys

from .cli import main

sys.exit(main())
