"""Run the splitleak CLI with `python -m orchestration`."""

import sys

from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from orchestration.cli import main  # noqa: E402

sys.exit(main())
