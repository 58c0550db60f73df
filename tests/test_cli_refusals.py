"""Bad input at the command line: exit 2 with one sentence, never a traceback (issue 13,
item 5): unwritable or full output directories, bad analysis inputs, bad arguments, configs
that name unknown attacks or overlapping features, data paths that are directories."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attacker.cli import main as attacker_main
from label_party.cli import main as label_party_main
from orchestration.cli import main as splitleak_main
from passive_party.cli import main as passive_party_main
from tests.conftest import scaled, small_config, write_config


def exit_code_and_text(main, argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Run a CLI's main() in this process; its exit code and everything it printed."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out + out.err


def _mount_tmpfs(directory: Path, options: str) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                            capture_output=True)
    return result.returncode == 0


@contextlib.contextmanager
def read_only_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory no one may write to: a read-only tmpfs (root), or mode 0555 (others)."""
    directory = tmp_path / "read-only"
    if os.geteuid() != 0:
        directory.mkdir()
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
        return
    if not _mount_tmpfs(directory, "ro,size=1m"):
        pytest.skip("needs a read-only directory: run as a non-root user, or as root with the "
                    "right to mount a tmpfs")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


@contextlib.contextmanager
def full_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs with no space left (where one can be mounted)."""
    directory = tmp_path / "full"
    if not _mount_tmpfs(directory, "size=64k"):
        pytest.skip("needs a full disk: a small tmpfs that root may mount")
    try:
        with contextlib.suppress(OSError), (directory / "filler").open("wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def _assert_one_sentence(code: int, text: str, *needles: str) -> None:
    assert code == 2, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_unusable_output_directory_exits_2_for_every_cli(tmp_path: Path, kind: str,
                                                         capsys: pytest.CaptureFixture) -> None:
    where = read_only_directory if kind == "read-only" else full_directory
    with where(tmp_path) as directory:
        reason = "Read-only file system" if kind == "read-only" else "No space left on device"
        if kind == "read-only" and os.geteuid() != 0:
            reason = "Permission denied"
        config = write_config(tmp_path, small_config(tmp_path, run={
            "name": "t", "seed": 3, "output_dir": str(directory / "runs")}))
        code, text = exit_code_and_text(splitleak_main, ["run", str(config), "--no-progress"], capsys)
        _assert_one_sentence(code, text, reason)
        code, text = exit_code_and_text(label_party_main, [
            "serve", "--config", str(config), "--run-dir", str(directory / "run")], capsys)
        _assert_one_sentence(code, text, reason, "run directory")
        code, text = exit_code_and_text(passive_party_main, [
            "run", "--config", str(config), "--party-id", "1", "--label-party", "127.0.0.1:1",
            "--run-dir", str(directory / "run")], capsys)
        _assert_one_sentence(code, text, reason)
        code, text = exit_code_and_text(attacker_main, [
            "serve", "--listen", "127.0.0.1:0", "--out", str(directory / "run")], capsys)
        _assert_one_sentence(code, text, reason)
        assert not list(directory.rglob(".*.tmp")), "a temporary file was left behind"


def test_labels_on_a_full_disk_leave_no_temporary_file(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """The label party's first real write (its labels) fails cleanly: exit 2, nothing torn."""
    with full_directory(tmp_path) as directory:
        config = write_config(tmp_path, small_config(tmp_path))
        run = directory / "run"
        run.mkdir()
        (run / "config.toml").write_text("")  # exists: nothing else written before the labels
        filler = directory / "filler"
        os.truncate(filler, filler.stat().st_size - 4096)  # one page: the probe fits, labels not
        code, text = exit_code_and_text(label_party_main, [
            "serve", "--config", str(config), "--run-dir", str(run), "--listen", "127.0.0.1:0"],
            capsys)
        _assert_one_sentence(code, text, "No space left on device")
        assert not list(directory.rglob(".*.tmp"))


def test_a_full_disk_at_the_final_model_save_is_an_os_error(tmp_path: Path) -> None:
    """At 920e7e0 torch's own writer failed with "basic_ios::clear: iostream error" (or
    "enforce fail ... unexpected pos"), a RuntimeError the label party reported as an
    internal error with a traceback; now it is ENOSPC naming the file (exit 2, one sentence)."""
    import errno

    import torch

    from label_party.outputs import write_outputs
    from splitleak.artifacts.paths import RunDir

    class Trainer:
        def model_state(self) -> dict:
            return {"top": torch.zeros(100_000)}

    with full_directory(tmp_path) as directory:
        run = RunDir(directory / "run")
        run.label_party.mkdir(parents=True)
        with pytest.raises(OSError) as err:
            write_outputs(run, Trainer())  # type: ignore[arg-type]
        assert err.value.errno == errno.ENOSPC and "top.pt" in str(err.value.filename), err.value
        assert not list(directory.rglob(".*.tmp")) and not run.top_model.exists()


def test_a_full_disk_mid_checkpoint_is_an_os_error_however_much_room_was_left(
        tmp_path: Path) -> None:
    """With 1.3 MB of disk a run's label party failed at its checkpoint of step 180 with
    torch's "enforce fail ... unexpected pos 36096 vs 35988" RuntimeError (its zip writer's exit
    raising over the ENOSPC of the file's write), and the run said only 'label party exited with
    code 1: label party failed'. Whatever room is left, save_torch now raises the ENOSPC,
    naming the file, and leaves nothing behind."""
    import errno

    import torch

    from splitleak.checkpoint import save_torch

    state = {"trainer": {f"w{i}": torch.zeros(n) for i, n in enumerate([20000, 64, 1000, 20000, 7])},
             "rng": torch.get_rng_state()}
    with full_directory(tmp_path) as directory:
        filler = directory / "filler"
        for _ in range(16):  # a page more room each time, up to the whole tmpfs
            os.truncate(filler, max(filler.stat().st_size - 4096, 0))
            with pytest.raises(OSError) as err:
                save_torch(directory / "label_party.pt", state)
            assert err.value.errno == errno.ENOSPC, err.value
            assert err.value.filename == str(directory / "label_party.pt")
            assert [p.name for p in directory.iterdir()] == ["filler"]


def test_a_full_disk_at_a_metrics_record_names_the_file(tmp_path: Path) -> None:
    """On a 400 KB disk a run failed 'the label party cannot go on: cannot write: No space left
    on device': which file was left to guess (label_party/metrics.jsonl, cut at 4096 bytes).
    The metrics writer's error now names it."""
    import errno

    from splitleak.artifacts.metrics import MetricsWriter

    with full_directory(tmp_path) as directory:
        writer = MetricsWriter(directory / "metrics.jsonl")
        with pytest.raises(OSError) as err:
            for step in range(1000):  # the first flush past the free room fails
                writer.write({"type": "train", "step": step, "loss": 0.5, "pad": "x" * 100})
        assert err.value.errno == errno.ENOSPC
        assert err.value.filename == str(directory / "metrics.jsonl"), err.value


@pytest.mark.parametrize(("setup", "args", "needle"), [
    ("missing", [], "does not exist"),
    ("not a run", [], "not a run directory"),
    ("run", ["--hints", "0,-1"], "positive integers"),
    ("run", ["--attacks", "norm:foo=1"], "--attacks norm.foo: Extra inputs are not permitted"),
    ("run", ["--attacks", "mean:centers=hint,hints=abc"], "'abc' is text; give a number (got 'abc')\n"),
    ("run", ["--attacks", "clustering:scope=epoch,scope=batch"], "scope is given twice"),
    ("run", ["--attacks", "clustering:=epoch"],  # said "clustering.: Extra inputs ..."
     "--attacks 'clustering:=epoch': expected name:key=value,... (no key before '=' in '=epoch')"),
    ("empty labels", [], "holds no labels"),
    ("corrupt config", [], "not a readable experiment config"),
])
def test_analyze_refuses_bad_input_with_exit_2(tmp_path: Path, setup: str, args: list[str],
                                               needle: str, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    if setup != "missing":
        run.mkdir()
    if setup in ("run", "empty labels", "corrupt config"):
        (run / "config.toml").write_text("[run]\nseed = 1\n" if setup != "corrupt config"
                                         else "[run\nseed = = 1\n")
        (run / "label_party").mkdir()
        labels = pa.table({"sample_id": pa.array([], pa.int64()), "label": pa.array([], pa.int64())})
        if setup != "empty labels":
            labels = pa.table({"sample_id": [0, 1], "label": [0, 1]})
        pq.write_table(labels, run / "label_party" / "labels.parquet")
        gradients = run / "attacker" / "gradients"
        gradients.mkdir(parents=True)
        (gradients / "index.json").write_text('{"format": 1, "run_id": "r", "parties": {}}')
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run), *args], capsys)
    _assert_one_sentence(code, text, needle)


@pytest.mark.parametrize("args", [["--parties", "0"], ["--parties", "-3"], ["--parties", "65"],
                                  ["--parties", "2", "--days", "0"]])
def test_certs_refuses_impossible_counts(tmp_path: Path, args: list[str],
                                         capsys: pytest.CaptureFixture) -> None:
    code, text = exit_code_and_text(splitleak_main, ["certs", str(tmp_path / "c"), *args], capsys)
    _assert_one_sentence(code, text, "--parties must be 1..64")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(("attacks", "needle"), [
    ([{"name": "no_such_attack"}], "attacker.attacks[0].name"),
    ([{"name": "hint_distance", "k": 0}], "attacker.attacks[0]"),
    ([{"name": "norm", "bogus": 1}], "attacker.attacks[0]"),
])
def test_validate_refuses_unknown_attacks_before_anything_starts(
        tmp_path: Path, attacks: list, needle: str, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, small_config(tmp_path, attacker={"attacks": attacks}))
    for argv in (["validate", str(config)], ["run", str(config), "--no-progress"]):
        code, text = exit_code_and_text(splitleak_main, argv, capsys)
        _assert_one_sentence(code, text, needle)
    assert not (tmp_path / "runs").exists(), "a run started despite the bad attack"


def test_overlapping_passive_columns_warn_unless_allowed(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    overlapping = {"passive": [[0, 20], [10, 30]]}
    config = write_config(tmp_path, small_config(tmp_path, features=overlapping))
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 0 and "passive parties 1 and 2 both hold columns [10, 20)" in text
    allowed = write_config(tmp_path, small_config(
        tmp_path, features={**overlapping, "allow_overlap": True}), "allowed.toml")
    code, text = exit_code_and_text(splitleak_main, ["validate", str(allowed)], capsys)
    assert code == 0 and "both hold columns" not in text


def test_overlapping_passive_columns_are_a_warning_of_the_report_too(tmp_path: Path) -> None:
    """At 920e7e0 the warning was on the console only, and report.md said "Warnings: none"."""
    from attacker.analysis.analyze import analyze
    from attacker.report.report import write_report
    from orchestration.reference import run_reference
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.config import parse_config

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 20], [10, 30]]},
                                    training={"batch_size": 128, "epochs": 1, "eval_interval": 0},
                                    attacker={"attacks": ["norm"]}))
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    summary = analyze(run.root)
    assert any("passive parties 1 and 2 both hold columns [10, 20)" in w for w in summary["warnings"])
    write_report(run, summary)
    warnings = (run.report / "report.md").read_text().split("## Warnings", 1)[1]
    assert "both hold columns [10, 20)" in warnings.split("##", 1)[0]


def test_a_data_path_that_is_a_directory_says_so(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, small_config(tmp_path, dataset={
        "name": "criteo", "params": {"path": str(tmp_path)}}, features={"ratios": [1, 1]}))
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    _assert_one_sentence(code, text, "is a directory")


def _criteo_lines(rows: int, bad_line: int | None = None, bad_fields: int | None = None) -> str:
    lines = []
    for i in range(rows):
        ints = [str((i * 7 + j) % 50) for j in range(13)]
        if i + 1 == bad_line:
            ints[1] = "abc"
        fields = [str(i % 2), *ints, *(f"{(i * 31 + j) % 997:08x}" for j in range(26))]
        if i + 1 == bad_fields:
            fields = fields[:30]
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"


# No core files, SIGXFSZ ignored (an ignored signal stays ignored across exec): set by a
# shell, since a preexec_fn runs Python between fork and exec, which may deadlock when this
# process has threads (gRPC's) of earlier tests.
QUIET_SHELL = ["bash", "-c", "ulimit -c 0; trap '' XFSZ; exec \"$@\"", "quiet"]


@pytest.mark.slow
def test_malformed_data_ends_in_one_sentence_never_an_abort(tmp_path: Path) -> None:
    """A passive party reading malformed data exits 2 with the file, line and column, every
    time (readers are closed before the process exits, and none runs threads meanwhile)."""
    # The bad value past the first 4 MiB block: the reader is mid-file when the error comes.
    cases = {"value": (_criteo_lines(20_000, bad_line=19_000), 2),
             "fields": (_criteo_lines(3_000, bad_fields=2_000), 1),
             "binary": (_criteo_lines(2_000) + "\x00\xff\xfe garbage \x01\n" * 50, 1)}
    for name, (text, repeats) in cases.items():
        path = tmp_path / f"{name}.txt"
        path.write_text(text, errors="surrogateescape")
        config = write_config(tmp_path, small_config(
            tmp_path, dataset={"name": "criteo", "params": {"path": str(path), "vocab_size": 100}},
            features={"ratios": [1, 1]}), f"{name}.toml")
        for _ in range(repeats):
            result = subprocess.run(
                [*QUIET_SHELL, sys.executable, "-m", "passive_party", "run", "--config", str(config),
                 "--party-id", "1", "--label-party", "127.0.0.1:1", "--run-dir", str(tmp_path)],
                capture_output=True, text=True, timeout=scaled(120))
            assert result.returncode == 2, (name, result.returncode, result.stderr[-2000:])
            # refused by the config's validation (which reads the file's layout) or while
            # loading (a bad value): one log line with its timestamp and role prefix, like
            # every other process's, naming the file and line
            assert "Traceback" not in result.stderr and f"{name}.txt, line" in result.stderr
            error = next(line for line in result.stderr.splitlines() if f"{name}.txt, line" in line)
            assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ passive-party-1 ERROR ", error), error


def test_label_party_refuses_a_run_directory_that_holds_a_run_or_is_served(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`label-party serve --run-dir` on a finished run overwrote its outcome, and two label
    parties on one directory interleaved their steps and deleted each other's checkpoints."""
    from splitleak.artifacts.paths import RunDir
    from splitleak.artifacts.rundir import serving

    config = write_config(tmp_path, small_config(tmp_path))
    run = RunDir(tmp_path / "run")
    run.label_party.mkdir(parents=True)
    run.outcome.write_text('{"status": "ok"}\n')
    argv = ["serve", "--config", str(config), "--run-dir", str(run.root), "--listen", "127.0.0.1:0"]
    code, text = exit_code_and_text(label_party_main, argv, capsys)
    assert code == 2 and "already holds a run (it has label_party/outcome.json)" in text, text
    assert f"--resume {run.root}" in text
    assert run.outcome.read_text() == '{"status": "ok"}\n'  # left as it was

    served = RunDir(tmp_path / "served")
    argv[4] = str(served.root)
    with serving(served):  # another label party holds it
        code, text = exit_code_and_text(label_party_main, argv, capsys)
    assert code == 2 and "is in use by another splitleak process" in text, text
    assert "serving it with another label party" in " ".join(text.split())


def test_a_run_with_nothing_to_analyse_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """examples/vflair/base.toml on its own (no curious party) wrote no report and said nothing."""
    from orchestration.cli import main

    config = write_config(tmp_path, small_config(tmp_path, attacker={"enabled": False},
                                                 training={"epochs": 1}))
    code, text = exit_code_and_text(main, ["run", str(config), "--in-process", "--output-dir",
                                           str(tmp_path / "runs")], capsys)
    assert code == 0, text
    assert "no analysis, no report: the threat model has no curious" in " ".join(text.split())


@pytest.mark.parametrize("kind", ["device", "fifo", "missing"])
def test_a_path_that_is_no_regular_file_is_told_from_a_missing_one(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture) -> None:
    """/dev/null or a FIFO given as a config, sweep or data file was 'not found', as was a
    --resume run directory that does not exist; a FIFO is never opened (never a hang)."""
    path = {"device": Path("/dev/null"), "fifo": tmp_path / "pipe.toml",
            "missing": tmp_path / "absent.toml"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    what = {"device": "a character device", "fifo": "a named pipe (FIFO)"}.get(kind)
    needle = f"exists but is not a regular file (it is {what})" if what else "does not exist"
    data = write_config(tmp_path, small_config(tmp_path, dataset={
        "name": "criteo", "params": {"path": str(path)}}, features={"ratios": [1, 1]}), "data.toml")
    for argv in (["validate", str(path)], ["sweep", str(path)], ["validate", str(data)]):
        code, text = exit_code_and_text(splitleak_main, argv, capsys)
        assert code == 2 and f"{path} {needle}" in text and "not found" not in text, (argv, text)
    if kind == "missing":
        code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(path)], capsys)
        assert code == 2 and f"--resume: {path} does not exist" in text, text


def test_attack_parameters_take_toml_booleans() -> None:
    """`--attacks model_completion:baselines=false` was refused as text ('false' is text): a
    boolean parameter is spelt true/false, as in the config's TOML; other words stay text."""
    from attacker.cli import parse_attack

    assert parse_attack("model_completion:baselines=false,labelled_per_class=4") == (
        "model_completion", {"baselines": False, "labelled_per_class": 4})
    assert parse_attack("clustering:scope=epoch,flag=true") == (
        "clustering", {"scope": "epoch", "flag": True})


def test_a_run_with_nothing_to_analyse_names_every_setting_it_points_to(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The note after a run with attacker.enabled = false read "(attacker.enabled, , )": the
    terminal's markup took [threat.parties.K] and [threat.receiver] for style tags."""
    from orchestration.cli import main
    from tests.conftest import small_config, write_config

    cfg = write_config(tmp_path, small_config(tmp_path, attacker={"enabled": False},
                                              training={"max_steps": 2, "epochs": 1}))
    code, text = exit_code_and_text(main, ["run", str(cfg), "--in-process", "--no-progress"], capsys)
    assert code == 0, text
    assert "(attacker.enabled, [threat.parties.K], [threat.receiver])" in " ".join(text.split()), text
