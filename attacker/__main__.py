"""Run the attacker CLI with `python -m attacker`."""

import sys

from attacker.cli import main

sys.exit(main())
