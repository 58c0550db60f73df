"""Run the label_party CLI with `python -m label_party`."""

import sys

from label_party.cli import main

sys.exit(main())
