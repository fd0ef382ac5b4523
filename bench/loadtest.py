#!/usr/bin/env python
"""httpx load test of a running vaeserve; the code lives in service/loadtest.py (also
``vaeserve loadtest``). Example, closed loop against a local server:

    python bench/loadtest.py --url http://127.0.0.1:8000 --concurrency 4 --shape 1x16x2x4x4 --requests 200
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from service.cli.loadtest import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
