"""What `splitleak sweep --engine ray` says, fast and without a cluster, when no Ray cluster
answers at --address, when the one there refuses the driver, and when a role's actor dies."""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
import tomli_w

from orchestration.cli import main
from orchestration.sweep.ray_failures import died
from splitleak.stopping import Terminated
from tests.conftest import small_config, write_config

ray = pytest.importorskip("ray", reason="the Ray engine needs the optional extra splitleak[ray]")

TRIES = "RAY_gcs_server_port_wait_time_s"
# An ActorDiedError's text after `kill -9` of a RoleActor's process (Ray 2.60).
KILLED = """The actor died unexpectedly before finishing this task.
\tclass_name: RoleActor
\tactor_id: 7b05c4bafbe833d78562bf8f01000000
\tpid: 23687
\tnamespace: e0b1d8bb-0815-4788-a3d9-a0225c6a4477
\tip: 192.0.2.2
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker \
exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common \
causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray \
stop --force was called"""


@pytest.fixture(autouse=True)
def _ray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sweep command sets for Ray is undone after each test."""
    for name in ("RAY_py_gcs_connect_timeout_s", TRIES, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def _sweep_on(tmp_path: Path, address: str | None) -> int:
    base = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1}))
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1],
                                             "output_dir": str(tmp_path / "sweeps")}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--no-progress", "--no-compare", "--engine", "ray",
              *(["--address", address] if address is not None else [])])
    return exit_info.value.code


def _free_port() -> int:
    """A loopback port where nothing listens."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_dead_address_exits_2_naming_it_at_once(scheme: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """Ray alone kept retrying 'Failed to connect to GCS' for minutes; with ray://HOST:PORT it
    waited ~35 s for Ray's client, printed its INFO line and a UserWarning, then said the
    cluster 'refused this driver or did not answer'."""
    address = f"{scheme}127.0.0.1:{_free_port()}"
    started = time.monotonic()
    assert _sweep_on(tmp_path, address) == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at --address {address} (" in err, err
    assert "Traceback" not in err and "UserWarning" not in err and not ray.is_initialized()


def test_output_dir_and_shared_dir_together_are_refused(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """--shared-dir silently won: the sweep went to SHARED/<name>, not to --output-dir."""
    base = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1}))
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1]}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--no-progress", "--engine", "ray", "--shared-dir",
              str(tmp_path / "shared"), "--output-dir", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2 and "both say where the sweep goes" in err, err
    assert not (tmp_path / "shared").exists() and not (tmp_path / "out").exists()
    assert not ray.is_initialized()


def test_a_dead_ray_address_from_the_environment_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """RAY_ADDRESS with nothing there was called '--address' (none was given), and the advice
    was to leave --address out, which changed nothing."""
    port = _free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert _sweep_on(tmp_path, None) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no Ray cluster answers at RAY_ADDRESS 127.0.0.1:{port} (" in err, err
    assert "unset RAY_ADDRESS" in err and not ray.is_initialized()


def test_address_auto_without_a_running_instance_says_none_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said the cluster at auto 'refused this driver or did not answer' and told of tokens."""
    def none_here(**kwargs: object) -> None:
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to "
                              "connect to by setting `--address` flag or `RAY_ADDRESS` environment "
                              "variable.")

    monkeypatch.setattr(ray, "init", none_here)
    assert _sweep_on(tmp_path, "auto") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("no Ray cluster answers at --address auto (no Ray instance runs on this machine); "
            "give the GCS address") in err, err
    assert "refused" not in err


def test_a_cluster_that_refuses_the_driver_exits_2_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init's ConnectionError (another auth token here) is a sentence, not a traceback, and
    ray.init tries once, not 20 times."""
    tries = []

    def refuse(**kwargs: object) -> None:
        tries.append(os.environ.get(TRIES))
        cause = RuntimeError("Failed to connect to GCS.\nray.exceptions.AuthenticationError: RPC "
                             "error: InvalidAuthToken: Authentication token is missing or "
                             "incorrect. Note: RAY_AUTH_MODE is currently 'disabled'")
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}") from cause

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr("orchestration.sweep.ray_engine._not_a_gcs", lambda address: None)
    with socket.socket() as gcs:  # something listens at the address, answering as a GCS
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        address = f"127.0.0.1:{gcs.getsockname()[1]}"
        assert _sweep_on(tmp_path, address) == 2
    err = capsys.readouterr().err
    assert tries == ["1"] and TRIES not in os.environ
    assert (f"the Ray cluster at --address {address} refused this driver or did not answer "
            "(AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or "
            "incorrect); check the address") in " ".join(err.split()), err
    assert "Traceback" not in err


@pytest.mark.parametrize("speaks", ["nothing", "HTTP"])
def test_an_address_where_no_ray_cluster_answers_is_told_without_rays_own_lines(
        speaks: str, tmp_path: Path, capfd: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that accepts but is no GCS (a dashboard's, say): ray.init printed Ray's C++
    warnings ('[... W ...] rpc_client.h:153: Failed to connect to GCS at address ... within 5
    seconds', three of them) for 15 s, then said the cluster 'refused this driver'."""
    def no_init(**kwargs: object) -> None:
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", no_init)
    with socket.socket() as port:
        port.bind(("127.0.0.1", 0))
        port.listen()
        address = f"127.0.0.1:{port.getsockname()[1]}"
        if speaks == "HTTP":
            def answer() -> None:
                connection, _ = port.accept()
                with connection:
                    connection.recv(1024)
                    connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

            threading.Thread(target=answer, daemon=True).start()
        started = time.monotonic()
        assert _sweep_on(tmp_path, address) == 2
    assert time.monotonic() - started < 15
    err = " ".join(capfd.readouterr().err.split())
    assert (f"something listens at --address {address}, but it does not answer as a Ray cluster"
            in err), err
    assert "GCS address" in err and "rpc_client" not in err and "refused" not in err


def test_a_dead_actor_is_named_as_its_role_with_its_node_pid_and_rays_reason() -> None:
    where = {"node_id": "0d1a9c74" + "f" * 48, "ip": "192.0.2.2", "pid": 23687}
    assert died("passive party 1", where, KILLED) == (
        "passive party 1 (Ray actor on node 0d1a9c74 at 192.0.2.2, pid 23687) died: Worker "
        "unexpectedly exits with a connection error code 2. End of file")
    assert died("label party", None, KILLED).startswith(
        "label party (Ray actor on node at 192.0.2.2, pid 23687) died: Worker unexpectedly")
    assert died("attacker sidecar", None, "The actor died unexpectedly before finishing this task.") == (
        "attacker sidecar (Ray actor) died: The actor died unexpectedly before finishing this task")
    lost = "67f1f4ecd84d8cf647f100c2856f26777537f8949ed7afb1c5a583e8"  # its node died
    assert died("attacker sidecar", {"node_id": lost, "ip": "192.0.2.2", "pid": 20904},
                f"The actor died because its node has died. Node Id: {lost}\n\tpid: 20904") == (
        "attacker sidecar (Ray actor on node 67f1f4ec at 192.0.2.2, pid 20904) died: The actor "
        "died because its node has died")


@pytest.fixture
def one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    """A cluster of one 8-CPU node as the engine sees it, and a sweep's points of 4 roles."""
    from orchestration.sweep import ray_engine
    from orchestration.sweep.points import resolve
    from orchestration.sweep.spec import parse_sweep
    from splitleak.config import parse_config

    monkeypatch.setattr(ray_engine.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray_engine.ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 8.0}}])
    return resolve(parse_sweep({"sweep": {"name": "s", "seeds": [1]}}),
                   parse_config(small_config(tmp_path)), tmp_path / "s")


def test_the_banner_says_how_many_points_run_at_once_only_once_known(one_node: list) -> None:
    """It said "1 at a time" before the engine had connected, while the cluster ran 2."""
    from orchestration.sweep.ray_engine import RayEngine

    engine = RayEngine()
    assert engine.at_a_time() == "as many at a time as the cluster's CPUs hold"
    engine._connect(one_node)
    assert engine.at_a_time() == "2 at a time"  # 8 CPUs / 4 roles x 1 CPU
    assert RayEngine(jobs=3).at_a_time() == "3 at a time"


@pytest.mark.parametrize(("args", "said"), [
    (["--engine", "ray", "--cpus-per-role", "0"], "--cpus-per-role must be more than 0 and at most 64"),
    (["--engine", "ray", "--cpus-per-role", "65"], "at most 64, got 65"),
    (["--engine", "ray", "--cpus-per-role", "nan"], "at most 64, got nan"),
    (["--cpus-per-role", "0.5"], "--cpus-per-role applies only to --engine ray"),
])
def test_cpus_per_role_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str],
                                  said: str) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(write_config(
        tmp_path, small_config(tmp_path))), "seeds": [1], "output_dir": str(tmp_path / "out")}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--no-progress", "--no-compare", *args])
    assert exit_info.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_point_larger_than_the_cluster_is_told_of_cpus_per_role(one_node: list) -> None:
    """The hint "give each role fewer CPUs" named no option that does it."""
    from orchestration.sweep.ray_engine import RayEngine

    assert RayEngine()._unplaceable(9).endswith("give each role fewer CPUs with --cpus-per-role")
    assert RayEngine(cpus_per_role=0.5)._unplaceable(9) is None


def test_the_spread_refusal_says_what_it_counts(one_node: list) -> None:
    """It said "1 node(s) with 1 CPU free" of one node with 8 CPUs free."""
    from orchestration.sweep.engine import EngineError
    from orchestration.sweep.ray_engine import RayEngine

    with pytest.raises(EngineError, match=r"cluster has 1 node\(s\) with at least 1 CPU; add nodes"):
        RayEngine(spread=True)._connect(one_node)


def test_the_gcs_probe_goes_around_an_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe dialled through the environment's http_proxy (Ray's own gRPC does not), so a
    live cluster behind a proxy setting was refused as 'not a Ray cluster'. A gRPC server
    answers UNIMPLEMENTED (no GCS service) when reached directly, not the proxy's UNAVAILABLE."""
    from concurrent import futures

    import grpc

    from orchestration.sweep.ray_engine import _not_a_gcs

    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        why = _not_a_gcs(f"127.0.0.1:{port}")
    finally:
        server.stop(None)
    assert why is not None and why.startswith("UNIMPLEMENTED"), why


@pytest.mark.parametrize(("signum", "stopped"), [(signal.SIGINT, KeyboardInterrupt),
                                                 (signal.SIGTERM, Terminated)])
def test_a_stop_that_lands_in_a_weakref_callback_still_stops_the_sweep(
        one_node: list, monkeypatch: pytest.MonkeyPatch, signum: int, stopped: type) -> None:
    """Python raises Ctrl-C's KeyboardInterrupt wherever the main thread is: inside a weakref
    callback (Ray's object references and thread pools run them) it was printed as 'Exception
    ignored' and lost, and the sweep's points ran on to their end."""
    from orchestration.sweep.ray_engine import RayEngine

    def in_a_weakref_callback(signum_: int, frame: object) -> None:  # on the main thread
        class Held:
            pass

        held = Held()
        weakref.finalize(held, signal.raise_signal, signum)
        del held  # the finalizer runs here, and the stop's handler inside it

    told: list[str] = []

    def a_point(point: object, listener: object, cancel: threading.Event) -> None:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        if cancel.wait(5):
            told.append(cancel.why)  # type: ignore[attr-defined]

    previous = signal.signal(signal.SIGUSR1, in_a_weakref_callback)
    engine = RayEngine(jobs=1, poll=0.05)
    monkeypatch.setattr(engine, "_run_point", a_point)
    started = time.monotonic()
    try:
        with pytest.raises(stopped):
            engine.run(one_node, None)  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 4
    assert told == ["stopped by SIGTERM" if signum == signal.SIGTERM else "stopped by Ctrl-C"]


def test_a_lost_nodes_raylet_messages_stay_off_the_terminal(one_node: list,
                                                            capfd: pytest.CaptureFixture) -> None:
    """A node lost mid-sweep printed Ray's 'Raylet is terminated ...' with ~20 lines of state
    dump, twice, and 'The node ... has been marked dead', ahead of the point's own sentence:
    Ray's error listener on the driver prints every error a raylet publishes, whatever
    log_to_driver says. Other output it prints passes on."""
    from ray._private import worker as ray_worker

    from orchestration.sweep.ray_engine import RayEngine, _restore_ray_printing

    ray_own = ray_worker.print_to_stdstream
    RayEngine()._connect(one_node)
    try:
        lost = ("Raylet is terminated. Termination is unexpected. Possible reasons include: (1) "
                "SIGKILL by the user or system OOM killer\n    [state-dump] NodeManager ...")
        ray_worker.print_to_stdstream({"lines": [lost], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)  # as Ray's listen_error_messages calls it
        ray_worker.print_to_stdstream({"lines": ["A worker died (another job error)"], "pid": "raylet",
                                       "is_err": False}, ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": ["an actor's own line"], "pid": 4321,
                                       "ip": "192.0.2.2", "is_err": True,
                                       "task_name": "RoleActor.poll", "actor_name": ""},
                                      ignore_prefix=False)
        printed = capfd.readouterr()
    finally:
        _restore_ray_printing()
    assert "Raylet is terminated" not in printed.out + printed.err, printed
    assert "an actor's own line" in printed.err and "A worker died" in printed.out, printed
    assert ray_worker.print_to_stdstream is ray_own  # Ray's own, once the engine is done


def test_a_ray_without_print_to_stdstream_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Ray version may lack the function the engine wraps: nothing changes then, rather
    than every Ray sweep failing on an AttributeError; and a wrapped one is Ray's own again."""
    from ray._private import worker as ray_worker

    from orchestration.sweep.ray_engine import _quiet_raylet_messages, _restore_ray_printing

    ray_own = ray_worker.print_to_stdstream
    monkeypatch.delattr(ray_worker, "print_to_stdstream")
    _quiet_raylet_messages()
    assert not hasattr(ray_worker, "print_to_stdstream")
    _restore_ray_printing()
    monkeypatch.undo()
    _quiet_raylet_messages()
    assert ray_worker.print_to_stdstream is not ray_own
    _restore_ray_printing()
    assert ray_worker.print_to_stdstream is ray_own


def test_sigterm_while_ray_starts_stops_the_sweep_saying_so(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init puts in a SIGTERM handler of its own, sys.exit(15): a SIGTERM while Ray started
    ended the sweep with exit 15 and not a word, and one after it (outside the points' run)
    the same way."""
    def ray_init(**kwargs: object) -> None:  # what Ray 2.60's ray.init does first
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(ray, "init", ray_init)
    monkeypatch.setattr("orchestration.sweep.ray_engine.private_auth_token", lambda: None)
    base = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1}))
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1],
                                             "output_dir": str(tmp_path / "sweeps")}}))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["sweep", str(path), "--no-progress", "--no-compare", "--engine", "ray"])
    except SystemExit as stop:
        code = stop.code
    finally:
        kept = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)
    assert code == 143, code
    assert "stopped by SIGTERM" in capsys.readouterr().out
    assert kept is previous  # not Ray's, once the sweep is over


def test_a_handler_installed_from_c_is_put_back_as_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """signal.signal answers None for a handler a C library installed; putting None back raised
    TypeError as the stop block ended, over the stop itself."""
    from splitleak import stopping

    put: list[tuple[int, object]] = []

    def from_c(sig: int, handler: object) -> None:
        put.append((sig, handler))
        return None  # what the handler before was, for one installed from C

    monkeypatch.setattr(stopping.signal, "signal", from_c)
    with stopping.stops_noted():
        pass
    assert put[-2:] == [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL)]


def test_rays_start_up_lines_stay_off_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak sweep --engine ray` printed Ray's 'Token authentication is enabled ...' and
    'Started a local Ray instance.' ahead of the sweep's own lines; they go to the sweep's
    ray_driver.log, and an error Ray logs still reaches the terminal."""
    def ray_init(**kwargs: object) -> None:  # what Ray 2.60's ray.init logs, starting a cluster
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
            "Token authentication is enabled for this Ray cluster.")
        logging.getLogger("ray._private.worker").info("Started a local Ray instance.")
        logging.getLogger("ray._private.worker").error("a failure of Ray's own")

    monkeypatch.setattr(ray, "init", ray_init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 0.0}}])
    monkeypatch.setattr("orchestration.sweep.ray_engine.private_auth_token", lambda: None)
    base = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1}))
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1],
                                             "output_dir": str(tmp_path / "sweeps")}}))
    # as Ray's own handler of its "ray" logger, which writes to the terminal's stderr
    terminal = logging.StreamHandler(io.StringIO())
    logging.getLogger("ray").addHandler(terminal)
    try:  # no CPU for any role: the point fails at once
        code = main(["sweep", str(path), "--no-progress", "--no-compare", "--engine", "ray"])
    finally:
        logging.getLogger("ray").removeHandler(terminal)
    out = capsys.readouterr().out
    shown = terminal.stream.getvalue()
    assert code == 1, out
    assert "the point needs 4 roles x 1 CPU" in out, out
    for line in ("Token authentication", "Started a local Ray instance"):
        assert line not in shown + out, shown
        assert line in (tmp_path / "sweeps" / "s" / "ray_driver.log").read_text()
    assert "a failure of Ray's own" in shown, shown


def test_the_task_removing_a_points_files_imports_nothing_heavy() -> None:
    """The task removing a point's node-local files ran in a worker that imported the engine
    (torch, gRPC, the roles: 10.5 s on a loaded machine), past the 10 s the point waits for it:
    a killed role's folder stayed. Its function's module imports the standard library alone."""
    from orchestration.sweep.ray_engine import _remove_scratch

    module = _remove_scratch._function.__module__
    assert module == "orchestration.sweep.scratch", module
    done = subprocess.run([sys.executable, "-c", f"import sys, {module}; print(sorted(m for m in "
                           "('torch', 'grpc', 'ray', 'numpy') if m in sys.modules))"],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "[]", done
