"""splitleak.fileio.write_atomically: a unique temporary sibling per writer, an error naming the
file written, never the temporary one."""

from __future__ import annotations

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
    assert describe_os_error(raised.value) == f"cannot write {target}: Is a directory"
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_mode_is_the_files_from_the_start(tmp_path: Path) -> None:
    target = tmp_path / "key.pem"
    write_atomically(target, lambda tmp: tmp.write_text("secret"), mode=0o600)
    assert target.stat().st_mode & 0o777 == 0o600
