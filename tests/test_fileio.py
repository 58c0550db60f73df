"""splitleak.fileio.write_atomically: a unique temporary sibling per writer, an error naming the
file written, never the temporary one."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from splitleak.fileio import describe_os_error, write_atomically


def test_two_writers_of_one_file_never_remove_each_others_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "leak.parquet"
    inside, done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def slow(tmp: Path) -> None:  # the first writer is half-way when the second one fails
        tmp.write_text("first")
        inside.set()
        assert done.wait(30)
        assert tmp.exists(), "the other writer removed this writer's temporary file"

    def first() -> None:
        try:
            write_atomically(target, slow)
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            failures.append(err)

    writer = threading.Thread(target=first)
    writer.start()
    assert inside.wait(30)
    with pytest.raises(RuntimeError):
        write_atomically(target, lambda tmp: (_ for _ in ()).throw(RuntimeError("broken")))
    done.set()
    writer.join(30)
    assert not failures, failures
    assert target.read_text() == "first"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_directory_in_the_way_is_named(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        write_atomically(target, lambda tmp: tmp.write_text("{}"))
    assert raised.value.filename == str(target)
    assert describe_os_error(raised.value) == (f"cannot write {target}: Is a directory (a folder "
                                               "stands where this file should be)")
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_mode_is_the_files_from_the_start(tmp_path: Path) -> None:
    target = tmp_path / "key.pem"
    write_atomically(target, lambda tmp: tmp.write_text("secret"), mode=0o600)
    assert target.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("code", "meaning"), [
    (errno.ENOSPC, "the disk or the file-size limit is full"),
    (errno.EDQUOT, "the disk or the file-size limit is full"),
    (errno.EACCES, "this user may not write there"),
    (errno.EROFS, "its file system is mounted read-only"),
    (errno.ENAMETOOLONG, "longer than its file system allows"),
    (errno.ENOENT, "its folder does not exist"),
    (errno.ENOTDIR, "a file stands where a folder on its path should be"),
])
def test_each_failure_says_what_happened_to_the_file(code: int, meaning: str) -> None:
    """Every failed write read "cannot write FILE: REASON" alike, a full disk alone explained:
    a permission error, a read-only file system, a name too long and a missing folder now each
    say what that means for the file named."""
    said = describe_os_error(OSError(code, os.strerror(code), "/runs/t/attacker/summary.json"))
    assert said.startswith(f"cannot write /runs/t/attacker/summary.json: {os.strerror(code)} ("), said
    assert meaning in said, said


def test_an_error_naming_no_file_or_errno_is_said_in_its_own_words() -> None:
    assert describe_os_error(OSError("broken pipe")) == "cannot write: broken pipe"
