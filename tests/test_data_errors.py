"""A bad data file ends in exit 2 naming the file, line and column, every time (issue 26,
items 1 and 8): `splitleak validate` reads every value, quoted CSV fields are values, no
process aborts at its exit, and a run whose party refused its data says so in its outcome."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from orchestration.cli import main as splitleak_main
from splitleak.artifacts.paths import RunDir
from splitleak.datasets import DatasetError, build_dataset
from tests.conftest import scaled, small_config, write_config
from tests.test_cli_refusals import QUIET_SHELL, exit_code_and_text


def criteo_lines(rows: int, bad: dict[int, tuple[int, str]] | None = None,
                 short_line: int | None = None, quoted: bool = False) -> str:
    """A Criteo train.txt; `bad`: line -> (field index, value) to put there; `short_line`
    loses its last field; `quoted`: a comma-separated copy with a header, every value quoted."""
    lines = []
    for i in range(rows):
        fields = [str(i % 2), *(str((i * 7 + j) % 50) for j in range(13)),
                  *(f"{(i * 31 + j) % 997:08x}" for j in range(26))]
        if bad and i + 1 in bad:
            field, value = bad[i + 1]
            fields[field] = value
        if i + 1 == short_line:
            fields = fields[:-1]
        lines.append(",".join(f'"{f}"' for f in fields) if quoted else "\t".join(fields))
    if quoted:
        names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
        lines.insert(0, ",".join(f'"{name}"' for name in names))
    return "\n".join(lines) + "\n"


def criteo_config(tmp_path: Path, text: str, name: str = "criteo") -> Path:
    path = tmp_path / f"{name}.txt"
    path.write_text(text)
    return write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "criteo", "params": {"path": str(path), "vocab_size": 100}},
        features={"passive": [[0, 20], [20, 39]]}), f"{name}.toml")


@pytest.mark.parametrize(("bad", "needle"), [
    ({2500: (4, "abc")}, "line 2500: column 'I4' is 'abc', expected an integer"),
    ({2999: (0, "yes")}, "line 2999: column 'label' is 'yes', expected one of '0', '1'"),
    ({7: (2, "1.5")}, "line 7: column 'I2' is '1.5', expected an integer"),
])
def test_validate_reads_every_value(tmp_path: Path, bad: dict, needle: str,
                                    capsys: pytest.CaptureFixture) -> None:
    config = criteo_config(tmp_path, criteo_lines(3000, bad))
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert f"criteo.txt, {needle}" in " ".join(text.split()), text


def test_quoted_csv_fields_are_values(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A CSV copy whose writer quoted every field reads as the plain file does."""
    plain = build_dataset("criteo", {"path": str(criteo_config(tmp_path, criteo_lines(40))
                                                 .with_suffix(".txt"))})
    config = criteo_config(tmp_path, criteo_lines(40, quoted=True), "quoted")
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 0, text
    quoted = build_dataset("criteo", {"path": str(config.with_suffix(".txt"))})
    np.testing.assert_array_equal(quoted.features((0, 39)).numeric, plain.features((0, 39)).numeric)
    np.testing.assert_array_equal(quoted.features((0, 39)).categorical,
                                  plain.features((0, 39)).categorical)
    assert quoted.labels().tolist() == plain.labels().tolist()
    bad = criteo_config(tmp_path, criteo_lines(40, {12: (3, "x,y")}, quoted=True), "quoted_bad")
    code, text = exit_code_and_text(splitleak_main, ["validate", str(bad)], capsys)
    assert code == 2 and "line 13: column 'I3' is 'x,y', expected an integer" in text, text


def test_in_process_run_refuses_a_bad_value_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = criteo_config(tmp_path, criteo_lines(300, {250: (4, "abc")}))
    code, text = exit_code_and_text(splitleak_main, ["run", str(config), "--in-process",
                                                      "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert "line 250: column 'I4' is 'abc'" in " ".join(text.split()), text


@pytest.mark.slow
def test_validate_on_a_short_row_exits_2_every_time(tmp_path: Path) -> None:
    """At 920e7e0 about one try in three aborted (134, "terminate called without an active
    exception") after printing the right message: pyarrow's reader released its Python
    handler on an I/O thread while the interpreter was tearing down. 20 tries, 4 at a time."""
    config = criteo_config(tmp_path, criteo_lines(3, short_line=2))

    def attempt(_: int) -> subprocess.CompletedProcess:
        return subprocess.run([*QUIET_SHELL, sys.executable, "-m", "orchestration", "validate",
                               str(config)], capture_output=True, text=True, timeout=scaled(120))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, range(20)))
    codes = [r.returncode for r in results]
    assert codes == [2] * 20, (codes, [r.stderr[-500:] for r in results if r.returncode != 2])
    for result in results:
        assert "line 2: expected 40 fields" in result.stderr and "terminate" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("bad", "culprit"), [
    ({250: (0, "yes")}, "label party"),  # only the label party reads the labels
    ({250: (4, "abc")}, "passive party 1"),  # I4 is in passive party 1's columns
])
def test_a_party_refusing_its_data_fails_the_run_naming_it(tmp_path: Path, bad: dict,
                                                           culprit: str) -> None:
    """The run exits 2 (bad input) with the party's own DatasetError, never a SIGABRT, and its
    outcome says "failed" naming that party (not "interrupted": the orchestrator stopped the
    others)."""
    config = criteo_config(tmp_path, criteo_lines(300, bad))
    result = subprocess.run([*QUIET_SHELL, sys.executable, "-m", "orchestration", "run",
                             str(config), "--no-progress"], capture_output=True, text=True,
                            timeout=scaled(240))
    text = " ".join(result.stdout.split())
    assert result.returncode == 2, text + result.stderr
    assert f"run failed: {culprit} exited with code 2" in text, text
    assert "DatasetError" in text and "line 250: column" in text and "SIGABRT" not in text, text
    outcome = json.loads(RunDir(next((tmp_path / "runs").iterdir())).outcome.read_text())
    assert outcome["status"] == "failed" and outcome["culprit"] == culprit, outcome
    assert "DatasetError" in outcome["message"], outcome


# --- what a loader reads is the file's text, and validate refuses what a run would -----------


def criteo_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_field_over_pythons_csv_limit_does_not_hide_the_bad_line(tmp_path: Path) -> None:
    """The error path's line scan once stopped at a 200,000-character field (a traceback)."""
    text = criteo_lines(300, {21: (20, "x" * 200_000)}, short_line=201)
    with pytest.raises(DatasetError, match=r"line 201: expected 40 fields .* got 39"):
        build_dataset("criteo", {"path": criteo_file(tmp_path, "long.txt", text)}).labels()


def test_a_row_longer_than_a_block_is_named_with_the_limit(tmp_path: Path) -> None:
    text = criteo_lines(5, {3: (20, "x" * 10_000_000)})
    with pytest.raises(DatasetError, match=r"line 3: the row is 10,000,\d+ bytes long; a row may "
                                           r"be at most 4,194,304 bytes"):
        build_dataset("criteo", {"path": criteo_file(tmp_path, "huge.txt", text)}).labels()


@pytest.mark.parametrize("name", ["criteo", "adult"])
def test_a_file_of_one_huge_line_is_refused_in_bounded_memory(tmp_path: Path, name: str) -> None:
    """A 300 MB file without a line end (a disk image given as the path) took 915 MB to refuse:
    its first line (read to tell the separator or a header) and the long-row scan each held
    the whole line, and so would a 10 GB one. Now neither holds more than a block."""
    import tracemalloc

    file = tmp_path / "image.img"
    file.write_bytes(b"\0" * 40_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match=r"line 1: the row is 40,000,000 bytes long"):
            build_dataset(name, {"path": str(file)}).labels()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32_000_000, peak  # less than the line (before: 84 MB; now about 5 blocks)


@pytest.mark.parametrize("max_rows", [None, 60_000])
def test_a_file_with_classic_mac_line_ends_larger_than_a_block_is_read(
        tmp_path: Path, max_rows: int | None) -> None:
    """Lines ended by a lone \\r (Excel's "CSV (Macintosh)"): a file under 4 MiB was read, one
    over it (5.9 MB) refused as 'a row is longer than 4,194,304 bytes', naming no line: the
    long-row check knew only \\n, pyarrow reads \\r as a line end too."""
    rows = criteo_lines(70_000).splitlines()
    mac, unix = tmp_path / "mac.txt", tmp_path / "unix.txt"
    mac.write_bytes(("\r".join(rows) + "\r").encode())
    unix.write_bytes(("\n".join(rows) + "\n").encode())
    assert mac.stat().st_size > 4 << 20
    params = {} if max_rows is None else {"max_rows": max_rows}
    read = build_dataset("criteo", {"path": str(mac), **params})
    expected = build_dataset("criteo", {"path": str(unix), **params})
    assert read.schema().num_rows == (max_rows or 70_000)
    np.testing.assert_array_equal(read.labels(), expected.labels())
    np.testing.assert_array_equal(read.features((0, 39)).categorical,
                                  expected.features((0, 39)).categorical)


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_the_archive_as_downloaded_is_named_as_an_archive(tmp_path: Path, mode: str) -> None:
    """Criteo's dac.tar.gz (train.txt inside) given as the path was refused as 'line 21:
    expected 40 fields ..., got 1: '\\x00\\x00...'' (the tar's padding), its first row read
    with the tar header glued to its label."""
    import tarfile

    inner = Path(criteo_file(tmp_path, "train.txt", criteo_lines(20)))
    archive = tmp_path / ("dac.tar.gz" if mode == "w:gz" else "dac.tar")
    with tarfile.open(archive, mode) as tar:
        tar.add(inner, arcname="train.txt")
    with pytest.raises(DatasetError) as err:
        build_dataset("criteo", {"path": str(archive)})
    assert f"{archive} is a tar archive (as downloaded?): unpack it (e.g. tar xf) and give the " \
        "path of the data file in it" in str(err.value), err.value
    assert build_dataset("criteo", {"path": str(inner)}).labels().size == 20


@pytest.mark.parametrize(("name", "spaced"), [("criteo", "{} "), ("cifar10", " {}")])
def test_a_path_pasted_with_a_space_around_it_names_the_file_that_exists(
        tmp_path: Path, name: str, spaced: str) -> None:
    """path = "/data/criteo/train.txt " said '/data/criteo/train.txt  does not exist', the
    space unseen, of a file that `ls` shows."""
    file = tmp_path / "train.txt"
    file.write_text(criteo_lines(10))
    with pytest.raises(DatasetError) as err:
        build_dataset(name, {"path": spaced.format(file)}).schema()
    assert f"does not exist (the path {spaced.format(file)!r} has spaces around it; {file} " \
        "exists)" in str(err.value), err.value


# The row starts early in the first block, or 163 bytes before its end (two boundaries crossed).
@pytest.mark.parametrize("before", [2, 15_397])
@pytest.mark.parametrize("packed", [False, True])
def test_a_row_of_5_mib_is_refused_wherever_it_sits(tmp_path: Path, before: int,
                                                    packed: bool) -> None:
    """pyarrow refuses only a row that straddles two block boundaries: a 5 MiB row at line 3
    was once read, the same row 4 MiB into the file refused."""
    text = criteo_lines(before + 5, {before + 1: (20, "x" * 5_000_000)})
    path = Path(criteo_file(tmp_path, "huge.txt", text))
    if packed:
        path.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    with pytest.raises(DatasetError, match=rf"line {before + 1}: the row is 5,000,\d+ bytes long; "
                                           r"a row may be at most 4,194,304 bytes"):
        build_dataset("criteo", {"path": str(path)}).labels()
    # Beyond max_rows it is never read, as any other line there.
    assert build_dataset("criteo", {"path": str(path), "max_rows": before}).labels().size == before


def test_rows_of_exactly_a_block_are_read(tmp_path: Path) -> None:
    from splitleak.datasets.delimited import BLOCK_BYTES, RowLimit, RowTooLong

    def read_all(data: bytes, chunk: int) -> bytes:
        import io

        limited, parts = RowLimit(io.BufferedReader(io.BytesIO(data), chunk), 10), []
        while part := limited.read(chunk):
            parts.append(part)
        return b"".join(parts)

    fits = b"123456789\n" * 5 + b"abc\n" + b"123456789\n"  # lines of 10 bytes, line end included
    for chunk in (1, 3, 10, 11, 64):
        assert read_all(fits, chunk) == fits
        for bad in (b"1234567890\n", b"ab\n1234567890\n", b"12\n" + b"x" * 11):
            with pytest.raises(RowTooLong):
                read_all(fits + bad, chunk)
    text = criteo_lines(4)
    row = text.split("\n")[1]
    exact = row.split("\t")
    exact[20] = "x" * (BLOCK_BYTES - len(row) - 1 + len(exact[20]))  # the row and its \n: a block
    lines = text.split("\n")
    lines[1] = "\t".join(exact)
    assert len(lines[1]) + 1 == BLOCK_BYTES
    path = criteo_file(tmp_path, "block.txt", "\n".join(lines))
    assert build_dataset("criteo", {"path": path}).labels().size == 4


def test_gzip_files_are_read_as_their_text(tmp_path: Path) -> None:
    """Separator, header and error lines come from the decompressed text, told by the file's
    first bytes (not its name); another compression is refused."""
    plain = build_dataset("criteo", {"path": criteo_file(tmp_path, "p.csv", criteo_lines(
        40, quoted=True))})
    packed = tmp_path / "p.csv.gz"
    packed.write_bytes(gzip.compress(criteo_lines(40, quoted=True).encode()))
    unnamed = tmp_path / "p.csv"
    unnamed.write_bytes(packed.read_bytes())  # gzip without the .gz name
    for path in (packed, unnamed):
        dataset = build_dataset("criteo", {"path": str(path)})
        np.testing.assert_array_equal(dataset.features((0, 39)).categorical,
                                      plain.features((0, 39)).categorical)
        assert dataset.labels().tolist() == plain.labels().tolist()
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(gzip.compress(criteo_lines(100, {77: (0, "2")}).encode()))
    with pytest.raises(DatasetError, match=r"line 77: column 'label' is '2'"):
        build_dataset("criteo", {"path": str(bad)}).labels()
    other = tmp_path / "p.txt.bz2"
    other.write_bytes(bz2.compress(criteo_lines(4).encode()))
    with pytest.raises(DatasetError, match=r"p.txt.bz2 is bzip2-compressed: decompress it first"):
        build_dataset("criteo", {"path": str(other)})


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a BOM; the header is still told as one."""
    text = criteo_lines(40, quoted=True)
    (tmp_path / "bom.csv").write_text(text, encoding="utf-8-sig")
    dataset = build_dataset("criteo", {"path": str(tmp_path / "bom.csv")})
    plain = build_dataset("criteo", {"path": criteo_file(tmp_path, "p.csv", text)})
    assert dataset.labels().tolist() == plain.labels().tolist()
    np.testing.assert_array_equal(dataset.features((0, 39)).numeric, plain.features((0, 39)).numeric)


def test_an_unterminated_quote_is_named_on_its_own_line(tmp_path: Path) -> None:
    text = criteo_lines(300, {41: (20, '"abc')}, quoted=False).replace("\t", ",")
    with pytest.raises(DatasetError, match=r"line 41: expected 40 fields"):
        build_dataset("criteo", {"path": criteo_file(tmp_path, "quote.csv", text)}).labels()


def test_lines_beyond_max_rows_are_never_read(tmp_path: Path) -> None:
    lines = criteo_lines(300, {150: (20, "a\tb")})  # line 150 has 41 fields
    dataset = build_dataset("criteo", {"path": criteo_file(tmp_path, "extra.txt", lines),
                                       "max_rows": 100})
    dataset.check_values()
    assert dataset.schema().num_rows == 100 and dataset.labels().size == 100
    assert dataset.features((0, 39)).num_rows == 100
    blank = criteo_file(tmp_path, "blank.txt", lines.replace("\n", "\n\n", 10))
    assert build_dataset("criteo", {"path": blank, "max_rows": 100}).labels().size == 100


@pytest.mark.parametrize(("name", "lines", "line", "column"), [
    ("criteo", criteo_lines(40, {31: (20, "caf\udce9")}).split("\n"), 31, "C7"),
    ("adult", ["39, caf\udce9, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, "
               "White, Male, 2174, 0, 40, United-States, <=50K"], 1, "workclass"),
    ("avazu", ["click,hour,app_id", "0,14102100,a", "1,14102100,caf\udce9"], 3, "app_id"),
])
def test_validate_names_bytes_that_are_not_utf8(tmp_path: Path, name: str, lines: list[str],
                                                line: int, column: str) -> None:
    """Criteo's and Avazu's categories are only hashed, but a run's reader still refuses them."""
    path = tmp_path / "latin1.txt"
    path.write_bytes("\n".join(lines).encode(errors="surrogateescape"))
    dataset = build_dataset(name, {"path": str(path)})
    with pytest.raises(DatasetError, match=rf"line {line}: column '{column}' is b'.*caf\\xe9'"):
        dataset.check_values()
        dataset.schema()


def test_validate_refuses_a_file_of_one_class(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """No test_fraction helps a file whose labels are all 0: validate says so, as the run does."""
    text = "".join("0" + line[1:] + "\n" for line in criteo_lines(300).splitlines())
    config = criteo_config(tmp_path, text)
    code, output = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    output = " ".join(output.split())
    assert code == 2 and "all 300 row(s) read are of class 0" in output, output
    assert "test_fraction" not in output, output


def cifar10_config(tmp_path: Path, labels: list[int]) -> Path:
    path = tmp_path / f"{len(set(labels))}.bin"  # records are read once per process and path
    path.write_bytes(b"".join(bytes([label]) + bytes(3072) for label in labels))
    return write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "cifar10", "params": {"path": str(path)}},
        features={"passive": [[0, 16], [16, 32]]},
        model={"kind": "cnn", "layers": [8], "channels": [4], "cut_layer": 1}))


def test_validate_names_the_classes_a_multiclass_file_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A CIFAR-10 file of one class once trained to a test accuracy of 1.0 without a word."""
    config = cifar10_config(tmp_path, [3] * 40)
    code, output = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 2 and "all 40 row(s) read are of class 3" in " ".join(output.split()), output
    config = cifar10_config(tmp_path, [3, 5] * 20)
    code, output = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 0 and "hold 2 of the 10 classes (3, 5)" in " ".join(output.split()), output


def test_a_missing_relative_data_file_names_the_directory_it_was_looked_for_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One party per host: a host whose process starts elsewhere (or lacks the file) was told
    'file not found: data/spambase.data', not where that was."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError) as err:
        build_dataset("spambase", {"path": "data/spambase.data"}).schema()
    assert f"data/spambase.data (relative to the working directory {tmp_path}) does not exist" \
        in str(err.value), err.value
    with pytest.raises(DatasetError) as err:
        build_dataset("spambase", {"path": str(tmp_path / "absent.data")}).schema()
    assert f"{tmp_path / 'absent.data'} does not exist; give the path" in str(err.value), err.value


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gzip_file_is_named_not_a_traceback(tmp_path: Path, damage: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    """A cut or corrupted .gz once ended validate with pyarrow's OSError traceback, exit 1."""
    packed = bytearray(gzip.compress(criteo_lines(3000).encode()))
    if damage == "truncated":
        del packed[len(packed) // 2:]
    else:
        packed[len(packed) // 2:len(packed) // 2 + 10] = bytes(10)
    path = tmp_path / "damaged.txt.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(DatasetError, match=r"damaged.txt.gz: its gzip stream is damaged"):
        build_dataset("criteo", {"path": str(path)}).labels()
    config = write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "criteo", "params": {"path": str(path), "vocab_size": 100}},
        features={"passive": [[0, 20], [20, 39]]}))
    code, output = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 2 and "its gzip stream is damaged" in output and "Traceback" not in output, output


def test_a_passive_party_whose_copy_of_the_data_differs_is_refused_at_join(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One party per host, each with its own copy of `spam.data`: a copy with other rows but as
    many (another sample, or the rows in another order) joined, and the run trained on rows
    whose sample ids did not align, without a word (only the row count was compared)."""
    import asyncio

    import grpc

    from passive_party.client import load_bottom
    from splitleak.data_files import data_digests
    from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
    from tests.live import join_request, label_party
    from tests.test_resume_data import spam_config, spam_file

    for host, seed in (("label-host", 0), ("same-host", 0), ("other-host", 1)):
        spam_file(tmp_path / host / "spam.data", seed=seed)
    cfg = spam_config(tmp_path, "spam.data")

    async def join_from(host: str) -> grpc.aio.AioRpcError | None:
        monkeypatch.chdir(tmp_path / host)
        request = join_request(cfg, load_bottom(cfg, 1), data_digests=data_digests(cfg))
        async with grpc.aio.insecure_channel(serving.address) as channel:
            try:
                await pb_grpc.LabelPartyStub(channel).Join(request, timeout=scaled(10))
            except grpc.aio.AioRpcError as err:
                return err
        return None

    async def go() -> tuple[grpc.aio.AioRpcError | None, grpc.aio.AioRpcError | None]:
        nonlocal serving
        monkeypatch.chdir(tmp_path / "label-host")
        async with label_party(cfg, tmp_path / "run") as (serving, _):
            return await join_from("other-host"), await join_from("same-host")

    serving = None
    refused, joined = asyncio.run(go())
    assert refused is not None and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (f"passive party 1's copy of dataset.params.path ({tmp_path / 'label-host' / 'spam.data'}"
            " on the label party's host) differs from the label party's") in refused.details()
    assert "every host needs the same data file, row for row" in refused.details()
    assert joined is None, joined.details()


@pytest.mark.parametrize("name", ["criteo", "adult"])
def test_a_data_file_without_read_permission_is_named(tmp_path: Path, name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A data file mode 000 (copied from another user's account) stopped validate and every
    role with a traceback: PermissionError: [Errno 13] Permission denied: '.../train.txt'."""
    file = tmp_path / "train.txt"
    file.write_text(criteo_lines(10))
    file.chmod(0)
    if os.geteuid() == 0:  # root reads any file: refuse it as the file system would
        opened = Path.open

        def refuse(path: Path, *args: object, **kwargs: object) -> object:
            if path == file:
                raise PermissionError(13, "Permission denied", str(path))
            return opened(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(DatasetError) as err:
        build_dataset(name, {"path": str(file)})
    message = str(err.value)
    assert f"{file} cannot be read (Permission denied): give this process read access" in message, \
        message


def test_an_adult_file_of_another_delimiter_is_not_named_a_header(tmp_path: Path) -> None:
    """adult.data written with ';' between its fields was refused as "line 1: the file has a
    header line ('39;State-gov;77516;...'), but this format has none ...: delete the header
    line"; deleting it refused the next line the same way. It now names the field count."""
    row = "39;State-gov;77516;Bachelors;13;Never-married;Adm-clerical;Not-in-family;White;" \
          "Male;2174;0;40;United-States;<=50K\n"
    file = tmp_path / "adult.data"
    file.write_text(row * 10)
    with pytest.raises(DatasetError) as err:
        build_dataset("adult", {"path": str(file)}).schema()
    message = str(err.value)
    assert f"{file}, line 1: expected 15 fields separated by ','" in message, message
    assert "got 1: '39;State-gov;77516;" in message and "header" not in message, message


def test_a_spambase_file_with_a_header_line_is_named_as_such(tmp_path: Path) -> None:
    """spambase.data has no header; a copy with one was refused as "line 1: column 'spam' is
    'spam', expected one of '0', '1'", which says nothing of a header. It now says the file has
    a header line, the format expected, and to delete the line; a gzip copy likewise."""
    from splitleak.datasets.spambase import NUMERIC

    rows = "".join(",".join([*("0.5" for _ in NUMERIC), str(i % 2)]) + "\n" for i in range(20))
    plain = tmp_path / "spambase.data"
    plain.write_text(",".join([*NUMERIC, "spam"]) + "\n" + rows)
    packed = tmp_path / "spambase.data.gz"
    packed.write_bytes(gzip.compress(("\n" + ",".join([*NUMERIC, "class"]) + "\n" + rows).encode()))
    for file, line in ((plain, 1), (packed, 2)):
        with pytest.raises(DatasetError) as err:
            build_dataset("spambase", {"path": str(file)}).schema()
        message = str(err.value)
        assert f"{file}, line {line}: the file has a header line ('word_freq_make," in message, message
        assert "but this format has none (UCI spambase.data: 57 numbers then a 0/1 label, " \
               "comma-separated; every line is a row): delete the header line" in message, message
    plain.write_text(rows)  # as distributed: read
    assert build_dataset("spambase", {"path": str(plain)}).schema().num_rows == 20
    plain.write_text("x" + rows)  # one bad number in the first row is a bad value, not a header
    with pytest.raises(DatasetError, match="word_freq_make"):
        build_dataset("spambase", {"path": str(plain)}).check_values()
