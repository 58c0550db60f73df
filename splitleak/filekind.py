"""Why a path given as an input file is none: missing, a directory, a FIFO or a device."""

from __future__ import annotations

import stat
from pathlib import Path

KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path: Path) -> str:
    """What `path` is instead of a regular file to read, as a sentence's end: "does not exist",
    "is a directory", "exists but is not a regular file (it is a named pipe (FIFO))"; told by
    its status alone, so a FIFO is never opened (which would wait for a writer)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist" + _spaced(path)
    except OSError as err:  # a folder on the way that may not be searched, a loop of links
        return f"cannot be looked at ({err.strerror or err})"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISREG(mode):
        return "is a file"
    kind = next((name for test, name in KINDS if test(mode)), "a special file")
    return f"exists but is not a regular file (it is {kind})"


def _spaced(path: Path) -> str:
    """A hint when `path` differs from an existing one only by spaces around it (a path pasted
    with a space before or after it reads as the same on screen)."""
    given = str(path)
    trimmed = Path(given.strip())
    if not given.strip() or str(trimmed) == given or not trimmed.exists():
        return ""
    return f" (the path {given!r} has spaces around it; {trimmed} exists)"
