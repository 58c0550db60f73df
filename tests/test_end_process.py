"""How a console entry point ends: with its code, its cleanup done, also when interrupted twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import scaled, small_config, write_config


def test_a_second_ctrl_c_does_not_stop_the_cleanup_half_way() -> None:
    """The second Ctrl-C of a user who stops a sweep lands while the atexit handlers run (the
    zygote's close); it is ignored there, so the handler finishes and nothing is printed."""
    script = textwrap.dedent("""
        import atexit, os, signal, time
        from splitleak.cli_common import end_process

        def cleanup():
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
            time.sleep(0.2)
            print("cleaned up", flush=True)

        def main():
            atexit.register(cleanup)
            raise KeyboardInterrupt  # the first: the command stops

        end_process(main)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "cleaned up\n"
    assert "Exception ignored" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_passive_party_stopped_by_sigterm_says_so(tmp_path: Path) -> None:
    """It died without a word in its log; it still dies of the signal."""
    config = write_config(tmp_path, small_config(tmp_path, topology={"join_deadline_s": 60}))
    party = subprocess.Popen([sys.executable, "-m", "passive_party", "run", "--config",
                              str(config), "--party-id", "1", "--label-party", "127.0.0.1:1",
                              "--run-dir", str(tmp_path / "run")],
                             stderr=subprocess.PIPE, text=True)
    try:
        assert party.stderr is not None
        for line in party.stderr:  # joining: it retries a label party that is not there
            if "computes on" in line:
                break
        time.sleep(0.5)
        party.send_signal(signal.SIGTERM)
        _, err = party.communicate(timeout=scaled(30))
    finally:
        party.kill()
        party.wait()
    assert party.returncode == -signal.SIGTERM, err
    assert "passive party 1: stopped by SIGTERM" in err, err
