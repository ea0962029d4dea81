"""``python -m app.targets.simulator``: the simulator's command (``cli.main``), as
``SimulatorProcess`` starts it."""

from __future__ import annotations

import sys

from app.targets.simulator.cli import main

if __name__ == "__main__":
    sys.exit(main())
