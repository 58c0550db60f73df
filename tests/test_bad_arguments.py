"""Bad command-line arguments exit 2 naming the option and what is allowed, before any work
runs: seeds, counts, bounds, devices, addresses, output paths (never a traceback, never
silently accepted)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attacker.bench.attacks import main as attacker_bench_attacks_main
from attacker.cli import main as attacker_main
from orchestration.cli import main as splitleak_main
from orchestration.gafm_select import main as gafm_select_main
from splitleak.arguments import host_port
from tests.conftest import small_config, tiny_sweep_file, write_config
from tests.test_cli_refusals import exit_code_and_text
from tests.test_compare import fake_run, leak_entry

Main = Callable[[list[str]], int]


def assert_refused(main: Main, argv: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    code, text = exit_code_and_text(main, argv, capsys)
    assert code == 2, text
    assert needle in text and "Traceback" not in text, text


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    """A file, a directory, and paths below a file and under /proc."""
    (tmp_path / "file.txt").write_text("")
    (tmp_path / "dir").mkdir()
    return {"file": str(tmp_path / "file.txt"), "dir": str(tmp_path / "dir"),
            "below_file": str(tmp_path / "file.txt" / "x"), "proc": "/proc/splitleak-x",
            "run": str(tmp_path / "run")}


ANALYZE = [
    (["--seed", "99999999999999999999999"], "argument --seed: 99999999999999999999999 is outside 0.."),
    (["--seed", "-1"], "argument --seed: -1 is outside 0.."),
    (["--draws", "1000000000"], "argument --draws: 1000000000 is outside 1..1000"),
    (["--hints", "100000"], "argument --hints: expected positive integers up to 1000"),
    (["--device", "bogus"], "argument --device: 'bogus' is not a device; allowed: auto, cpu"),
    (["--device", "cuda:99"], "--device = 'cuda:99', but this machine has"),
]


@pytest.mark.parametrize(("args", "needle"), ANALYZE)
def test_analyze_refuses_bad_options(paths: dict[str, str], args: list[str], needle: str,
                                     capsys: pytest.CaptureFixture) -> None:
    assert_refused(attacker_main, ["analyze", paths["run"], *args], needle, capsys)


@pytest.mark.parametrize(("args", "needle"), [
    (["--output-dir", "{file}"], "argument --output-dir: {file} is a file, not a directory"),
    (["--output-dir", "{below_file}"], "{file} is a file, not a directory"),
    (["--output-dir", "{proc}"], "argument --output-dir: {proc}: cannot create a directory in /proc"),
    (["--party", "0"], "argument --party: 0 is outside 1..64"),
    (["--party", "-1"], "argument --party: -1 is outside 1..64"),
    (["--party", "99"], "argument --party: 99 is outside 1..64"),
    (["--max-utility-cost", "-1"], "argument --max-utility-cost: -1 is out of range; allowed: [0, 1]"),
    (["--max-utility-cost", "nan"], "argument --max-utility-cost: 'nan' is not a finite number"),
    (["--target-utility", "nan"], "argument --target-utility: 'nan' is not a finite number [0, 1]"),
])
def test_compare_refuses_bad_options(paths: dict[str, str], args: list[str], needle: str,
                                     capsys: pytest.CaptureFixture) -> None:
    argv = ["compare", paths["dir"], *(a.format(**paths) for a in args)]
    assert_refused(splitleak_main, argv, needle.format(**paths), capsys)


def test_compare_names_a_party_the_runs_do_not_have(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    fake_run(tmp_path / "runs" / "a", small_config(tmp_path), 0.9, [leak_entry("norm", 0.8, 0.9)])
    argv = ["compare", str(tmp_path / "runs"), "--party", "2", "--output-dir", str(tmp_path / "out")]
    assert_refused(splitleak_main, argv, "--party 2: the compared runs measured a leak at passive "
                   "parties [1]", capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--output-dir", "{file}"], "argument --output-dir: {file} is a file, not a directory"),
    (["--engine", "ray", "--address", "notanaddr"], "argument --address: 'notanaddr' is not HOST:PORT"),
    (["--engine", "ray", "--address", "h:99999"],
     "port 99999 of 'h:99999' is not a TCP port to connect to (1..65535)"),
    (["--engine", "ray", "--shared-dir", "{below_file}"], "argument --shared-dir"),
])
def test_sweep_refuses_bad_options(tmp_path: Path, paths: dict[str, str], args: list[str],
                                   needle: str, capsys: pytest.CaptureFixture) -> None:
    argv = ["sweep", str(tiny_sweep_file(tmp_path)), "--engine", "inprocess", "--jobs", "1",
            *(a.format(**paths) for a in args)]
    assert_refused(splitleak_main, argv, needle.format(**paths), capsys)
    assert not (tmp_path / "sweeps").exists()


def test_sweep_refuses_an_output_dir_from_its_file_that_is_a_file(
        tmp_path: Path, paths: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    sweep = tiny_sweep_file(tmp_path)
    text = sweep.read_text().replace(str(tmp_path / "sweeps"), paths["file"])
    sweep.write_text(text)
    argv = ["sweep", str(sweep), "--engine", "inprocess", "--jobs", "1"]
    assert_refused(splitleak_main, argv, f"cannot write the sweep directory {paths['file']}/tiny: "
                   f"{paths['file']} is a file, not a directory", capsys)


@pytest.mark.parametrize(("args", "needle"), [
    (["--device", "bogus"], "argument --device: 'bogus' is not a device; allowed: auto, cpu"),
    (["--json", "{dir}"], "argument --json: {dir} is a directory; give a file name"),
    (["--json", "{below_file}"], "argument --json: {below_file}: {file} is a file, not a directory"),
    (["--busy-load", "-1"], "argument --busy-load: -1 is out of range; allowed: >= 0"),
    (["--busy-load", "nan"], "argument --busy-load: 'nan' is not a finite number >= 0"),
])
def test_bench_refuses_bad_options(paths: dict[str, str], args: list[str], needle: str,
                                   capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "--steps", "10", "--quick", *(a.format(**paths) for a in args)]
    assert_refused(splitleak_main, argv, needle.format(**paths), capsys)


@pytest.mark.parametrize(("args", "needle"), [
    (["--json", "{dir}"], "argument --json: {dir} is a directory"),
    (["--output-dir", "{file}"], "argument --output-dir: {file} is a file, not a directory"),
    (["--fraction", "0"], "argument --fraction: 0 is out of range; allowed: (0, 1]"),
    (["--deltas", "0.7"], "argument --deltas: 0.7 is out of range; allowed: [0, 0.5]"),
    (["--repeats", "0"], "argument --repeats: 0 is outside 1..1000"),
    (["--deltas", "0.1", "0.2", "0.10"], "argument --deltas: 0.1 given more than once"),
    (["--engine", "ray", "--address", "x"], "argument --address: 'x' is not HOST:PORT"),
    (["--engine", "ray", "--shared-dir", "{dir}", "--output-dir", "{dir}"],
     "both say where the trials go"),
])
def test_gafm_select_refuses_bad_options(tmp_path: Path, paths: dict[str, str], args: list[str],
                                         needle: str, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, small_config(tmp_path, objective={"name": "gafm"}))
    argv = [str(config), *(a.format(**paths) for a in args)]
    assert_refused(gafm_select_main, argv, needle.format(**paths), capsys)
    assert_refused(splitleak_main, ["gafm-select", *argv], needle.format(**paths), capsys)


def test_gafm_select_refuses_a_network_its_engine_does_not_emulate(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--engine inprocess ran every trial with [network] ignored, where `splitleak sweep
    --engine inprocess` refuses such a config; now refused too, before any trial runs."""
    config = write_config(tmp_path, small_config(
        tmp_path, objective={"name": "gafm"}, network={"one_way_latency_ms": 25.0},
        model={"kind": "mlp", "layers": [16], "cut_layer": 1, "top": "none", "aggregation": "sum"}))
    assert_refused(gafm_select_main, [str(config), "--engine", "inprocess", "--output-dir",
                                      str(tmp_path / "trials")],
                   "the config (25 ms one-way) sets [network] (an emulated wide-area link), which "
                   "only --engine local emulates (its relays run beside `splitleak run`); --engine "
                   "inprocess has no network to shape", capsys)
    assert not (tmp_path / "trials").exists()


def test_gafm_select_puts_its_trials_in_the_shared_dir(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--shared-dir D left the trials in a temporary directory of the driver (the Ray roles
    write in place: on another node, not on the mount every node shares), D unused."""
    from orchestration import gafm_select

    given = {}

    def select(cfg, **kwargs):
        given.update(kwargs)
        raise KeyboardInterrupt  # enough: where the trials would go is known

    monkeypatch.setattr(gafm_select, "select_delta", select)
    monkeypatch.setattr("orchestration.sweep.command.build_engine", lambda args: None)
    config = write_config(tmp_path, small_config(
        tmp_path, objective={"name": "gafm"}, model={"kind": "mlp", "layers": [16], "cut_layer": 1,
                                                     "top": "none", "aggregation": "sum"}))
    (tmp_path / "shared").mkdir()
    assert gafm_select_main([str(config), "--engine", "ray", "--shared-dir",
                             str(tmp_path / "shared")]) == 130
    assert given["output_dir"] == (tmp_path / "shared").resolve()


@pytest.mark.parametrize(("args", "needle"), [
    (["--parties", "0", "--skip-fuzz", "--steps", "5"], "argument --parties: 0 is outside 1..30"),
    (["--parties", "-1", "--skip-fuzz"], "argument --parties: -1 is outside 1..30"),
    # the long run splits breast_cancer's 30 columns: refused before the fuzzing, not after it
    (["--parties", "31", "--steps", "5"], "argument --parties: 31 is outside 1..30"),
    (["--skip-fuzz", "--skip-run"], "--skip-fuzz and --skip-run together leave nothing to soak"),
    (["--steps", "0"], "argument --steps: 0 is outside 1.."),
    (["--steps", "-5"], "argument --steps: -5 is outside 1.."),
    (["--seed", "-1", "--messages", "1", "--skip-run"], "argument --seed: -1 is outside 0.."),
    (["--messages", "0"], "argument --messages: 0 is outside 1.."),
    (["--messages", "-1"], "argument --messages: -1 is outside 1.."),
])
def test_soak_refuses_bad_options(args: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    assert_refused(splitleak_main, ["soak", *args], needle, capsys)


@pytest.mark.parametrize(("args", "needle"), [
    (["--rows", "0"], "argument --rows: 0 is outside 1..10000000"),
    (["--rows", "-1"], "argument --rows: -1 is outside 1.."),
    (["--rows", "99999999999999"], "argument --rows: 99999999999999 is outside 1..10000000"),
    (["--dim", "-3"], "argument --dim: -3 is outside 1.."),
    (["--dim", "0"], "argument --dim: 0 is outside 1.."),
    (["--batch-size", "0"], "argument --batch-size: 0 is outside 1.."),
    (["--batch-size", "-1"], "argument --batch-size: -1 is outside 1.."),
    (["--exact", "--rows", "64", "--batch-size", "0"], "argument --batch-size: 0 is outside 1.."),
    (["--exact", "--rows", "0"], "argument --rows: 0 is outside 1.."),
])
def test_attacker_bench_refuses_bad_sizes(args: list[str], needle: str,
                                          capsys: pytest.CaptureFixture) -> None:
    assert_refused(attacker_main, ["bench", *args], needle, capsys)
    if "--exact" not in args:
        assert_refused(attacker_bench_attacks_main, args, needle, capsys)


def test_certs_refuses_days_past_what_a_certificate_holds(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    argv = ["certs", str(tmp_path / "c"), "--parties", "2", "--days", "99999999"]
    assert_refused(splitleak_main, argv, "--days 1..36500 (got --parties 2, --days 99999999)", capsys)
    assert not (tmp_path / "c").exists()


def test_certs_never_overwrites_a_ca_unless_forced(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    argv = ["certs", str(tmp_path / "c"), "--parties", "1"]
    assert exit_code_and_text(splitleak_main, argv, capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()}
    assert_refused(splitleak_main, argv, f"{tmp_path / 'c' / 'ca.pem'} already exists; give --force",
                   capsys)
    assert {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()} == before
    assert exit_code_and_text(splitleak_main, [*argv, "--force"], capsys)[0] == 0
    assert (tmp_path / "c" / "ca.pem").read_bytes() != before["ca.pem"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["health", "127.0.0.1:99999"],
     "argument address: port 99999 of '127.0.0.1:99999' is not a TCP port to connect to (1..65535)"),
    (["health", "127.0.0.1:-1"], "argument address: '127.0.0.1:-1' is not HOST:PORT"),
    (["health", "127.0.0.1"], "argument address: '127.0.0.1' is not HOST:PORT"),
    (["health", "127.0.0.1:0"], "port 0 of '127.0.0.1:0' is not a TCP port to connect to (1..65535)"),
    (["health", "127.0.0.1:1", "--timeout", "-1"], "argument --timeout: -1 is out of range; allowed: (0,"),
    (["health", "127.0.0.1:1", "--timeout", "nan"], "argument --timeout: 'nan' is not a finite number"),
    (["health", "127.0.0.1:1", "--timeout", "inf"], "argument --timeout: 'inf' is not a finite number"),
    (["relay", "--to", "127.0.0.1:0"],
     "argument --to: port 0 of '127.0.0.1:0' is not a TCP port to connect to (1..65535)"),
    (["relay", "--to", "nohost"], "argument --to: 'nohost' is not HOST:PORT (e.g. 127.0.0.1:50051) or @FILE"),
    (["relay", "--to", "@f", "--listen", "h:70000"],
     "argument --listen: port 70000 of 'h:70000' is not a TCP port to listen on (0..65535)"),
])
def test_addresses_and_timeouts_are_checked(argv: list[str], needle: str,
                                            capsys: pytest.CaptureFixture) -> None:
    assert_refused(splitleak_main, argv, needle, capsys)


@pytest.mark.parametrize(("args", "with_config", "needle"), [
    (["--party", "0"], False, "argument --party: 0 is outside 1..64"),
    (["--receive", "-2"], False, "argument --receive: -2 is outside 1..64"),
    (["--party", "9"], True, "attacker serve --party 9: the config has passive parties 1..2"),
    (["--receive", "9"], True, "attacker serve --receive 9: the config has passive parties 1..2"),
    (["--listen", "127.0.0.1:99999"], False,
     "argument --listen: port 99999 of '127.0.0.1:99999' is not a TCP port to listen on (0..65535)"),
])
def test_attacker_serve_refuses_parties_and_ports_out_of_range(
        tmp_path: Path, args: list[str], with_config: bool, needle: str,
        capsys: pytest.CaptureFixture) -> None:
    config = ["--config", str(write_config(tmp_path, small_config(tmp_path)))] if with_config else []
    argv = ["serve", "--listen", "127.0.0.1:0", "--out", str(tmp_path / "run"), *config, *args]
    assert_refused(attacker_main, argv, needle, capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("address", ["label-party:50051", "0.0.0.0:0", "[::]:50051", "[::1]:1"])
def test_addresses_a_server_listens_on_are_still_accepted(address: str) -> None:
    assert host_port(0)(address) == address  # names, IPv4 and bracketed IPv6 (every interface)


def test_directory_and_output_file_options_name_a_file_in_their_way(
        tmp_path: Path, paths: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    """A --*-dir that is a file, or an output file below a file, says so (not "does not exist"
    or "File exists")."""
    from label_party.cli import main as label_party_main

    plaintext = write_config(tmp_path, small_config(tmp_path))
    tls = write_config(tmp_path, small_config(tmp_path, topology={"tls": True}), "tls.toml")
    file, below = paths["file"], paths["below_file"]
    for main, argv, needle in [
        (label_party_main, ["serve", "--config", str(tls), "--tls-dir", file],
         f"--tls-dir {file}: the TLS directory {file} is a file, not a directory"),
        (label_party_main, ["serve", "--config", str(plaintext), "--tls-dir", file],
         f"--tls-dir {file} is a file, not a directory, but the config says topology.tls = false"),
        (label_party_main, ["serve", "--config", str(plaintext), "--run-dir", file],
         f"the run directory is not writable: {file} is a file, not a directory"),
        (label_party_main, ["serve", "--config", str(plaintext), "--port-file", below],
         f"--port-file {below}: {file} is a file, not a directory"),
        (splitleak_main, ["relay", "--to", "127.0.0.1:1", "--port-file", below],
         f"--port-file {below}: {file} is a file, not a directory"),
        (splitleak_main, ["certs", file, "--parties", "1"],
         f"argument directory: {file} is a file, not a directory"),
        (splitleak_main, ["run", str(plaintext), "--output-dir", below],
         f"argument --output-dir: {below}: {file} is a file, not a directory"),
    ]:
        assert_refused(main, argv, needle, capsys)


def test_run_refuses_options_it_would_ignore(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, small_config(tmp_path))
    assert_refused(splitleak_main, ["run", str(config), "--single"],
                   f"--single picks the run without a defense out of the built-in default's two; "
                   f"the config {config} runs exactly one experiment already: drop --single", capsys)
    assert_refused(splitleak_main, ["run", "--resume", str(tmp_path), "--output-dir", str(tmp_path)],
                   "--output-dir: a resumed run continues in its own directory", capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option", ["compare", "certs", "gafm"])
def test_an_output_dir_whose_name_is_too_long_is_refused_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture, option: str) -> None:
    """A 300-character folder name stopped `splitleak compare --output-dir` (and every other
    output folder's check) with a traceback: OSError: [Errno 36] File name too long."""
    too_long = str(tmp_path / ("x" * 300))
    argv = {"compare": ["compare", str(tmp_path), "--output-dir", too_long],
            "certs": ["certs", too_long], "gafm": ["gafm-select", "--output-dir", too_long]}[option]
    if option == "gafm":
        code, text = exit_code_and_text(gafm_select_main, argv[1:], capsys)
    else:
        code, text = exit_code_and_text(splitleak_main, argv, capsys)
    assert code == 2, text
    assert "cannot be looked up: File name too long" in " ".join(text.split()), text
    assert "Traceback" not in text, text
