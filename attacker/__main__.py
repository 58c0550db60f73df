"""Run the attacker CLI with `python -m attacker`."""

import sys

from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from attacker.cli import main  # noqa: E402

sys.exit(main())
