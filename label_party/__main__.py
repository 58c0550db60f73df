"""Run the label_party CLI with `python -m label_party`."""

import sys

from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from label_party.cli import main  # noqa: E402

sys.exit(main())
