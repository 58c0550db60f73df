"""Run the passive_party CLI with `python -m passive_party`."""

from splitleak.cli_common import end_process
from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from passive_party.cli import main  # noqa: E402

end_process(main)  # the exit code it chose, never an abort at teardown
