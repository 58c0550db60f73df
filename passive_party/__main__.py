"""Run the passive_party CLI with `python -m passive_party`."""

import sys

from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from passive_party.cli import main  # noqa: E402

sys.exit(main())
