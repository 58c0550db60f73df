"""Run the splitleak CLI with `python -m orchestration`."""

from splitleak.cli_common import end_process
from splitleak.lifeline import follow_parent

follow_parent()  # before the heavy imports: an orphan stops at once
from orchestration.cli import main  # noqa: E402

end_process(main)  # the exit code it chose, never an abort at teardown
