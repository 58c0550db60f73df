"""Run the passive_party CLI with `python -m passive_party`."""

import sys

from passive_party.cli import main

sys.exit(main())
