#!/usr/bin/env python3
"""Training runner with liveness: see sacbot/app/runner.py (also `sacbot runner`).

    python tools/run_training.py --bots 2 --root runs/campaign --freeze-timeout 60 -- --steps 200000
"""

import sys

from sacbot.app.runner import main

if __name__ == "__main__":
    sys.exit(main())
