"""The shaping relay ([network]): each direction a link of its own with latency, bandwidth and
jitter; order kept; bounded memory; end to end in front of a real label party."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from orchestration.relay import Link, Relay, _link, cmd_relay, link_seed
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import RunDir
from splitleak.config import ConfigError, NetworkConfig, parse_config
from tests.conftest import scaled, small_config, write_config


def test_link_serialises_at_the_bandwidth_then_adds_the_latency() -> None:
    link = Link(latency_s=0.025, bandwidth_bps=8e6)  # 1 MB/s
    assert link.arrival(0.0, 100_000) == pytest.approx(0.1 + 0.025)  # 0.1 s on the wire
    assert link.arrival(0.0, 100_000) == pytest.approx(0.2 + 0.025)  # queued behind the first
    assert link.arrival(1.0, 1_000) == pytest.approx(1.001 + 0.025)  # the link was idle again


def test_jitter_never_reorders_and_is_seeded() -> None:
    def arrivals(seed: int, every: float) -> list[float]:
        link = Link(0.05, None, jitter_s=0.02, rng=np.random.default_rng(seed))
        return [link.arrival(i * every, 100) for i in range(200)]

    first = arrivals(1, 0.001)  # sent closer together than the jitter: order must be kept
    assert first == sorted(first) and first == arrivals(1, 0.001) and first != arrivals(2, 0.001)
    sparse = np.array(arrivals(1, 0.5)) - np.arange(200) * 0.5  # far apart: the jitter shows
    assert np.median(sparse) == pytest.approx(0.05, abs=0.005)
    assert np.std(sparse) == pytest.approx(0.02, rel=0.25)


def test_network_section_is_validated(tmp_path: Path) -> None:
    assert not NetworkConfig().shaped and NetworkConfig(one_way_latency_ms=1).shaped
    for network, field in [({"one_way_latency_ms": -1}, "one_way_latency_ms"),
                           ({"bandwidth_mbit": 0}, "bandwidth_mbit"), ({"loss": 0.1}, "loss")]:
        with pytest.raises(ConfigError, match=field):
            parse_config(small_config(tmp_path, network=network))
    # a round trip (the batch out, the activation back) at the step deadline fails every step
    # after waiting for it: refused at validation, naming both fields
    with pytest.raises(ConfigError, match=r"network.one_way_latency_ms = 3000 .* round trip 6 s, "
                       r"at or over topology.step_deadline_s = 2"):
        parse_config(small_config(tmp_path, network={"one_way_latency_ms": 3000},
                                  topology={"step_deadline_s": 2}))
    assert parse_config(small_config(tmp_path, network={"one_way_latency_ms": 900},
                                     topology={"step_deadline_s": 2})).network.shaped
    # a party's Join crosses it twice too: 1.5 s one-way against a 2 s join deadline left
    # every party 'did not join within 2 s' once the run had started
    with pytest.raises(ConfigError, match=r"network.one_way_latency_ms = 1500 makes every party's "
                       r"join round trip 3 s, at or over topology.join_deadline_s = 2, so every "
                       r"party would fail to join"):
        parse_config(small_config(tmp_path, network={"one_way_latency_ms": 1500},
                                  topology={"step_deadline_s": 60, "join_deadline_s": 2}))



def test_a_link_too_slow_for_a_batch_is_refused_before_the_run(tmp_path: Path) -> None:
    """0.01 Mbit/s: a batch of 64 rows x 16 float32 (4 KiB) up and its gradient down take 6.6 s;
    against a 5 s step deadline every step timed out (after the processes had started, naming
    the party, not the link); refused now at validation. float16 halves it (3.3 s: allowed);
    gzip or the sparse wire make the bytes unknown beforehand (not refused)."""
    from splitleak.validation import validate

    def config(**wire: object) -> object:
        return parse_config(small_config(tmp_path, network={"bandwidth_mbit": 0.01},
                                         topology={"step_deadline_s": 5}, wire=wire))

    with pytest.raises(ConfigError, match=r"network.bandwidth_mbit = 0.01: passive party 1's "
                       r"activation and cut gradient for a batch of 64 rows \(4 KiB each way\) "
                       r"take at least 6.55 s .* topology.step_deadline_s = 5"):
        validate(config())
    for wire in ({"dtype": "float16"}, {"compression": "gzip"}, {"sparse": True}):
        validate(config(**wire))


def test_a_link_too_slow_for_an_evaluation_batch_is_refused_before_the_run(tmp_path: Path) -> None:
    """test_fraction = 0.9 leaves 57 train rows but 512 test rows: a train step (57 x 16 float32,
    4 KiB each way) crosses 0.05 Mbit/s in 1.2 s, within the 2 s step deadline, but an
    evaluation batch of 512 rows (32 KiB) with the last cut gradient takes 5.8 s: every
    evaluation timed out, and validation named nothing. A faster link passes."""
    from splitleak.validation import validate

    def config(bandwidth: float, **training: object) -> object:
        return parse_config(small_config(
            tmp_path, dataset={"name": "breast_cancer", "test_fraction": 0.9},
            network={"bandwidth_mbit": bandwidth}, topology={"step_deadline_s": 2},
            training={"batch_size": 512, "epochs": 2, **training}))

    with pytest.raises(ConfigError, match=r"network.bandwidth_mbit = 0.05: passive party 1's "
                       r"activation for an evaluation batch of 512 rows \(32 KiB\), with the last "
                       r"train step's cut gradient \(4 KiB\), takes at least 5.83 s over the link, "
                       r"at or over topology.step_deadline_s = 2, so every evaluation would time"):
        validate(config(0.05))
    validate(config(0.2))


def test_the_train_split_scored_at_the_end_is_not_charged_with_the_cut_gradient(
        tmp_path: Path) -> None:
    """training.eval_train scores the train split after the test split: its batches travel
    alone, no larger than a train step's. A one-step run (512 train rows, 57 test rows) whose
    worst exchange is 32 + 3.6 KiB (1.5 s) was refused as 'an evaluation batch of 512 rows ...
    with the last train step's cut gradient ... 2.62 s'."""
    from splitleak.validation import validate

    for eval_train in (False, True):
        validate(parse_config(small_config(
            tmp_path, dataset={"name": "breast_cancer", "test_fraction": 0.1},
            network={"bandwidth_mbit": 0.2}, topology={"step_deadline_s": 2},
            training={"batch_size": 512, "epochs": 1, "eval_train": eval_train})))


@pytest.mark.parametrize(("training", "refused"), [
    ({"batch_size": 512, "eval_interval": 0}, False),  # one step an epoch: each evaluated
    ({"batch_size": 300, "eval_interval": 1}, False),
    ({"batch_size": 300, "checkpoint_every": 1}, False),
    ({"batch_size": 512}, True),  # evaluated every 3 steps: steps 1 and 2 carry a gradient
    ({"batch_size": 300}, True)])
def test_a_gradient_that_an_evaluation_or_a_checkpoint_carries_is_not_charged_to_a_train_step(
        tmp_path: Path, training: dict, refused: bool) -> None:
    """A step's cut gradient rides on the next train batch only where no evaluation pass or
    checkpoint comes between them. Full-batch training (426 train rows, batch_size 512, an
    evaluation each epoch) at 0.05 Mbit/s and a 6 s step deadline was refused as 'activation
    and cut gradient for a batch of 426 rows (27 KiB each way) take at least 8.72 s per train
    step', though each step's exchange carried the activation alone (4.4 s) and each
    evaluation batch the gradient (5.8 s): the run went fine. So were eval_interval = 1 and
    checkpoint_every = 1; the same link with gradients on train batches is still refused."""
    from splitleak.validation import validate

    cfg = parse_config(small_config(
        tmp_path, network={"bandwidth_mbit": 0.05}, topology={"step_deadline_s": 6},
        training={"epochs": 2, **training}))
    if refused:
        with pytest.raises(ConfigError, match=r"activation and cut gradient for a batch of "
                           r"\d+ rows .* so every step would time out"):
            validate(cfg)
    else:
        validate(cfg)



async def _through_relay(network: NetworkConfig, payload: int) -> tuple[float, float, bytes]:
    """(round-trip time of one byte, seconds to send `payload` bytes one way, what came back)."""
    received = bytearray()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(1))  # echo the ping
        await writer.drain()
        while chunk := await reader.read(1 << 16):
            received.extend(chunk)
        writer.write(b"done")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    port_file = Path(f"/tmp/relay-test-{port}")
    relay = asyncio.ensure_future(Relay(f"127.0.0.1:{port}", network).serve("127.0.0.1:0", port_file))
    while not port_file.exists():
        await asyncio.sleep(0.01)
    host, relay_port = port_file.read_text().rsplit(":", 1)
    port_file.unlink()
    reader, writer = await asyncio.open_connection(host, int(relay_port))
    start = time.perf_counter()
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    rtt = time.perf_counter() - start
    data = np.random.default_rng(0).bytes(payload)
    start = time.perf_counter()
    writer.write(data)
    writer.write_eof()
    assert await reader.read() == b"done"
    seconds = time.perf_counter() - start
    relay.cancel()
    server.close()
    return rtt, seconds, bytes(received)


def test_an_in_process_run_refuses_an_emulated_network(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """`splitleak run --in-process` ignored [network] without a word (the in-process sweep
    engine refuses it)."""
    from orchestration.cli import main
    from tests.test_cli_refusals import exit_code_and_text

    config = write_config(tmp_path, small_config(tmp_path, network={"one_way_latency_ms": 25}))
    code, text = exit_code_and_text(main, ["run", str(config), "--in-process",
                                           "--output-dir", str(tmp_path / "runs")], capsys)
    assert code == 2 and "[network] sets an emulated wide-area link" in text, text
    assert not (tmp_path / "runs").exists()


def test_relay_delays_and_throttles_real_connections() -> None:
    network = NetworkConfig(one_way_latency_ms=40, bandwidth_mbit=16)  # 2 MB/s each way
    rtt, seconds, received = asyncio.run(_through_relay(network, 1_000_000))
    assert received == np.random.default_rng(0).bytes(1_000_000)  # every byte, in order
    assert 0.08 <= rtt <= 0.08 + scaled(0.5)  # two one-way latencies, never less
    # 1 MB at 2 MB/s plus the latency there and back: never faster than the link allows
    assert 0.5 + 0.08 <= seconds <= 0.58 + scaled(2.0)


@pytest.mark.slow
def test_run_over_an_emulated_wan(tmp_path: Path) -> None:
    """`splitleak run` with [network]: a relay per passive party, TLS end to end through it;
    every step waits for at least one round trip (gradient + next batch out, activation back)."""
    data = small_config(tmp_path, training={"batch_size": 32, "epochs": 1, "max_steps": 12},
                        topology={"tls": True}, network={"one_way_latency_ms": 30})
    result = subprocess.run([sys.executable, "-m", "orchestration", "run", "--no-progress",
                             str(write_config(tmp_path, data))],
                            capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, result.stdout + result.stderr
    run = RunDir(next((tmp_path / "runs").iterdir()))
    pids = json.loads((run.root / "pids.json").read_text())
    assert {"relay 1", "relay 2"} <= pids.keys()
    assert "one-way latency 30 ms" in (run.logs / "relay_1.log").read_text()
    walls = [r["wall"] for r in read_metrics(run.metrics) if r["type"] == "train"]
    assert len(walls) == 12
    assert (walls[-1] - walls[0]) / 11 >= 0.06  # ≥ one round trip of 2 × 30 ms per step


def _relay_args(*extra: str) -> argparse.Namespace:
    """What `splitleak relay --to 127.0.0.1:1 EXTRA` parses to."""
    options = dict(zip(extra[::2], extra[1::2], strict=True))
    number = {"--latency-ms": float, "--jitter-ms": float, "--bandwidth-mbit": float,
              "--seed": int, "--party-id": int}
    given = {flag[2:].replace("-", "_"): number.get(flag, Path)(value)
             for flag, value in options.items()}
    return argparse.Namespace(**{"to": "127.0.0.1:1", "listen": "127.0.0.1:0", "port_file": None,
                                 **dict.fromkeys(("latency_ms", "jitter_ms", "bandwidth_mbit",
                                                  "seed", "config", "party_id")), **given})


def test_relay_takes_its_link_from_the_experiment(tmp_path: Path) -> None:
    """`splitleak relay --config F --party-id K` (the compose WAN variant) shapes exactly as
    `splitleak run` does for [network], with the same jitter seed."""
    config = write_config(tmp_path, small_config(tmp_path, run={"seed": 3}, network={
        "one_way_latency_ms": 25.0, "jitter_ms": 2.0, "bandwidth_mbit": 100.0}))
    network, seed = _link(_relay_args("--config", str(config), "--party-id", "2"))
    assert network == NetworkConfig(one_way_latency_ms=25.0, jitter_ms=2.0, bandwidth_mbit=100.0)
    assert seed == link_seed(3, 2) == 302
    assert _link(_relay_args("--latency-ms", "5")) == (NetworkConfig(one_way_latency_ms=5.0), 0)
    for extra, words in [(["--config", str(config)], "--party-id 1..2"),
                         (["--config", str(config), "--party-id", "3"], "--party-id 1..2"),
                         (["--config", str(config), "--party-id", "1", "--latency-ms", "5"],
                          "drop --latency-ms"),
                         (["--party-id", "1"], "only applies with --config")]:
        with pytest.raises(ValueError, match=words):
            _link(_relay_args(*extra))
    bad = subprocess.run([sys.executable, "-m", "orchestration", "relay", "--to", "127.0.0.1:1",
                          "--config", str(config)], capture_output=True, text=True,
                         timeout=scaled(60))
    assert bad.returncode == 2 and "--party-id 1..2" in bad.stderr and "Traceback" not in bad.stderr


def test_impossible_links_are_refused_at_validation(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """Caught only per connection at 920e7e0: `--seed -1` (each connection's jitter failed),
    port 99999, and a bandwidth so low that every connection stalled for good."""
    from orchestration.cli import main as splitleak_main
    from tests.test_cli_refusals import exit_code_and_text

    with pytest.raises(ValueError, match="--seed must be 0 or more"):
        _link(_relay_args("--seed", "-1"))
    for option in (["--listen", "127.0.0.1:99999"], ["--to", "127.0.0.1:99999"]):
        code, text = exit_code_and_text(splitleak_main, ["relay", "--to", "127.0.0.1:1", *option],
                                        capsys)
        assert code == 2 and "port 99999 of '127.0.0.1:99999' is not a TCP port" in text, text
    with pytest.raises(ConfigError, match="bandwidth_mbit"):
        parse_config(small_config(tmp_path, network={"bandwidth_mbit": 1e-9}))
    with pytest.raises(ConfigError, match="topology.label_party_address.*port 99999"):
        parse_config(small_config(tmp_path, topology={"label_party_address": "0.0.0.0:99999"}))


def test_the_relay_carries_a_bounded_number_of_connections() -> None:
    """At 920e7e0 50 slow connections held +275 MB; each holds up to 2 x FLIGHT chunks."""
    from orchestration.relay import MAX_CONNECTIONS

    async def go() -> tuple[int, int]:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # the far side: keeps every connection open

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        relay = Relay(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", NetworkConfig())
        front = await asyncio.start_server(relay._connection, "127.0.0.1", 0)
        port = front.sockets[0].getsockname()[1]
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
        closed = 0
        for reader, _ in connections:
            try:
                closed += await asyncio.wait_for(reader.read(), 0.5) == b""
            except TimeoutError:
                pass
        carried = relay.open
        for _, writer in connections:
            writer.close()
        front.close()
        server.close()
        return carried, closed

    carried, closed = asyncio.run(go())
    assert carried == MAX_CONNECTIONS and closed == 10 - MAX_CONNECTIONS


def test_a_party_connecting_before_the_label_party_listens_is_held_until_it_does() -> None:
    """By hand the roles start in any order. The relay closed a party's connection when
    nothing listened at --to yet: three closed connections read, to the party, as a label
    party refusing its TLS (or its plaintext), and it quit at once instead of waiting."""
    async def go() -> bytes:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))  # a free port the label party will listen on later
        port = probe.getsockname()[1]
        probe.close()
        relay = Relay(f"127.0.0.1:{port}", NetworkConfig())
        front = await asyncio.start_server(relay._connection, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", front.sockets[0].getsockname()[1])
        writer.write(b"hello")  # sent before anything listens: must not be lost
        await asyncio.sleep(0.5)

        async def echo(up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
            up_writer.write(await up_reader.readexactly(5))
            await up_writer.drain()
            up_writer.close()

        label = await asyncio.start_server(echo, "127.0.0.1", port)
        try:
            return await asyncio.wait_for(reader.read(), scaled(10))
        finally:
            writer.close()
            front.close()
            label.close()

    assert asyncio.run(go()) == b"hello"


def test_a_label_party_killed_mid_stream_ends_the_relayed_connection_quietly() -> None:
    """A label party killed while the relay still held the party's bytes for it: the relay (on
    uvloop, as `splitleak relay` runs) logged 'Unhandled exception in client_connected_cb' with
    a RuntimeError traceback; its sender could also block on the full queue for good."""
    uvloop = pytest.importorskip("uvloop")
    errors: list[dict] = []

    async def go() -> int:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))

        async def killed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)
            writer.transport.abort()  # as a process killed with SIGKILL: a reset

        label = await asyncio.start_server(killed, "127.0.0.1", 0)
        relay = Relay(f"127.0.0.1:{label.sockets[0].getsockname()[1]}",
                      NetworkConfig(one_way_latency_ms=20))
        front = await asyncio.start_server(relay._connection, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1",
                                                       front.sockets[0].getsockname()[1])
        with contextlib.suppress(ConnectionError):
            for _ in range(40):  # 2.5 MB: more than is in flight when the label party dies
                writer.write(bytes(64 << 10))
                await asyncio.wait_for(writer.drain(), scaled(10))
            await asyncio.wait_for(reader.read(), scaled(10))
        writer.close()
        end = time.monotonic() + scaled(10)
        while relay.open and time.monotonic() < end:
            await asyncio.sleep(0.05)
        front.close()
        label.close()
        return relay.open

    assert uvloop.run(go()) == 0, "the relayed connection never ended"
    assert not errors, errors


def test_an_unwritable_port_file_is_named_not_the_listen_address(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said 'cannot listen on 127.0.0.1:0: [Errno 30] Read-only file system' though
    listening worked, then 'File exists' for a port file below a file: now the file in the way
    is named before anything listens."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    port_file = blocker / "port"  # under a file: never writable, whoever runs the test
    args = _relay_args("--port-file", str(port_file))
    assert cmd_relay(args) == 2
    message = capsys.readouterr().err
    assert f"--port-file {port_file}: {blocker} is a file, not a directory" in message, message
    assert "cannot listen" not in message and "File exists" not in message, message


@pytest.mark.parametrize(("stop", "code", "by"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                  (signal.SIGTERM, -signal.SIGTERM, "SIGTERM")])
def test_a_stopped_relay_says_so(tmp_path: Path, stop: signal.Signals, code: int, by: str) -> None:
    """Run by hand in front of a label party, the relay serves until stopped; Ctrl-C or SIGTERM
    ended it without a word in its log."""
    port_file = tmp_path / "relay.addr"
    relay = subprocess.Popen([sys.executable, "-m", "orchestration", "relay", "--to", "127.0.0.1:1",
                              "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
                             stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + scaled(60)
        while not port_file.exists():
            assert time.monotonic() < end and relay.poll() is None
            time.sleep(0.05)
        relay.send_signal(stop)
        _, err = relay.communicate(timeout=scaled(30))
    finally:
        relay.kill()
        relay.wait()
    assert relay.returncode == code, err
    assert f"relay: stopped by {by} (0 connection(s) carried, 0 open)" in err, err


def test_a_relay_stopped_while_it_holds_a_connection_says_one_line(tmp_path: Path) -> None:
    """Ctrl-C while a party's connection was held (the label party not listening yet) or
    carried: under the stop line the relay printed 'Exception in callback ...' and a
    CancelledError traceback of each connection's handler."""
    port_file, log = tmp_path / "relay.addr", tmp_path / "relay.log"
    with log.open("w") as out:
        relay = subprocess.Popen([sys.executable, "-m", "orchestration", "relay", "--to",
                                  "127.0.0.1:1", "--listen", "127.0.0.1:0", "--port-file",
                                  str(port_file)], stderr=out)
    try:
        end = time.monotonic() + scaled(60)
        while not port_file.exists():
            assert time.monotonic() < end and relay.poll() is None
            time.sleep(0.05)
        host, port = port_file.read_text().strip().rsplit(":", 1)
        with socket.create_connection((host, int(port))) as party:
            party.sendall(b"hello")
            while "holding the party's connection" not in log.read_text():
                assert time.monotonic() < end and relay.poll() is None, log.read_text()
                time.sleep(0.05)
            relay.send_signal(signal.SIGINT)
            relay.wait(scaled(30))
    finally:
        relay.kill()
        relay.wait()
    err = log.read_text()
    assert relay.returncode == 130, err
    assert "relay: stopped by Ctrl-C (1 connection(s) carried, 1 open)" in err, err
    assert "Traceback" not in err and "Exception in callback" not in err, err


@pytest.mark.parametrize(("option", "line"), [
    (["--latency-ms", "-5"], "--latency-ms: Input should be greater than or equal to 0 (got -5.0)"),
    (["--bandwidth-mbit", "0.001"], "--bandwidth-mbit: Input should be greater than or equal to 0.01"),
    (["--jitter-ms", "nan"], "--jitter-ms: Input should be a finite number"),
])
def test_a_bad_link_option_is_named_by_its_flag(option: list[str], line: str,
                                                capsys: pytest.CaptureFixture) -> None:
    """`splitleak relay --latency-ms -5` was refused naming "one_way_latency_ms", a config
    field the user did not type; each option is now named by its flag."""
    from orchestration.cli import main as splitleak_main
    from tests.test_cli_refusals import exit_code_and_text

    code, text = exit_code_and_text(splitleak_main, ["relay", "--to", "127.0.0.1:1", *option],
                                    capsys)
    assert code == 2 and line in text, text
