"""Atomic file writes: readers never see a half-written file, a failed write leaves nothing."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A write failed because the disk (or the process's file-size limit) has no room left.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def write_atomically(path: Path, write: Callable[[Path], Any], mode: int | None = None) -> None:
    """Call `write` on a temporary sibling of its own, fsync it, then rename it over `path`.

    `mode` creates the file with these permissions from the start (e.g. 0o600 for a private
    key: there is no moment when others could read it). If anything fails, this call's
    temporary file is removed (another writer's, of the same `path`, is not) and the error
    propagates, naming `path`; `path` keeps its old content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path, 0o666 if mode is None else mode)
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        write(tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename == str(tmp):  # the file the caller asked for, not this one
            err.filename = str(path)
        name_file(err, path)
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def _temporary_sibling(path: Path, mode: int) -> Path:
    """A new, empty `.NAME.XXXXXXXX.tmp` beside `path`, created with `mode` (less the umask)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
        except FileExistsError:
            continue
        except OSError as err:
            err.filename = str(path)
            raise
        return tmp


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a machine crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def name_file(err: OSError, path: Path) -> OSError:
    """`err`, naming `path` where it names no file, as pyarrow's writers' errors do not
    ("Error writing bytes to file. Detail: [errno 28] No space left on device"): then in the
    system's words for its errno."""
    if not err.filename:
        err.filename = str(path)
        if err.errno:
            err.strerror = os.strerror(err.errno)
    return err


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Writes to `path` within: an OSError raised names it (name_file)."""
    try:
        yield
    except OSError as err:
        name_file(err, path)
        raise


# What a failed write's errno means for the file it names, and what to do about it.
_MEANINGS = {
    **dict.fromkeys(NO_SPACE, "the disk or the file-size limit is full"),
    errno.EACCES: "this user may not write there: see the owner and mode of it and its folder",
    errno.EPERM: "this user may not write there: see the owner and mode of it and its folder",
    errno.EROFS: "its file system is mounted read-only: remount it read-write or write elsewhere",
    errno.ENAMETOOLONG: "a name on its path is longer than its file system allows: choose a "
                        "shorter output folder or run name",
    errno.ENOENT: "its folder does not exist: was it moved or removed while this ran?",
    errno.ENOTDIR: "a file stands where a folder on its path should be",
    errno.EEXIST: "a file stands where this folder should be",
    errno.EISDIR: "a folder stands where this file should be",
}


def describe_os_error(err: OSError) -> str:
    """One sentence for a failed file operation: what, where, why in the system's words and
    what that means for the file (a full disk, a read-only file system, a missing folder...)."""
    where = f" {err.filename}" if err.filename else ""
    reason = err.strerror or str(err)
    meaning = _MEANINGS.get(err.errno) if err.errno is not None else None
    return f"cannot write{where}: {reason}" + (f" ({meaning})" if meaning else "")


def check_writable(directory: Path) -> None:
    """Create `directory` and prove a file can be written there (raises OSError if not)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"ok")
    finally:
        probe.unlink(missing_ok=True)
