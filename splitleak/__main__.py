"""Run the splitleak CLI with `python -m splitleak`."""

import sys

from splitleak.cli import main

sys.exit(main())
