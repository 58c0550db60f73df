"""How a console entry point ends: with its code, its cleanup done, also when interrupted twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
