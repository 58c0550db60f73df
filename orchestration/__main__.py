"""Run the splitleak CLI with `python -m orchestration`."""

import sys

from orchestration.cli import main

sys.exit(main())
