"""TLS identities that cannot serve are refused at start, naming the file; a refused handshake
is named by its actual reason (another role, an expired certificate, a plaintext peer) at once."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import socket
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from splitleak import tls
from splitleak.cli_common import EXIT_BAD_INPUT, BadInput, tls_dir_or_exit
from splitleak.config import AttackerConfig, TopologyConfig, parse_config
from splitleak.tap import Tap, TapError
from splitleak.transport import bind, create_server
from tests.conftest import scaled, small_config


def _generate_at(directory: Path, days_ago: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Identities made `days_ago` days ago, valid for 30 days from then."""
    then = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)

    class Then(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return then

    with monkeypatch.context() as patch:
        patch.setattr(tls, "dt", types.SimpleNamespace(datetime=Then, timedelta=dt.timedelta,
                                                       UTC=dt.UTC))
        tls.generate(directory, tls.identities(1))


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    directory = tmp_path / "certs"
    tls.generate(directory, tls.identities(1))
    return directory


@pytest.mark.parametrize(("damaged", "said"), [
    ("label-party.key", "label-party.key is not a PEM private key"),
    ("label-party.pem", "label-party.pem is not a PEM certificate"),
    ("ca.pem", "ca.pem is not a PEM certificate"),
])
def test_an_unparsable_identity_file_is_named(certs: Path, damaged: str, said: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (certs / damaged).write_bytes(b"garbage\n")
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, certs, tls.LABEL_PARTY)
    message = capsys.readouterr().err
    assert said in message and "splitleak certs" in message, message


def test_a_pair_its_own_ca_did_not_sign_is_refused_at_start(
        tmp_path: Path, certs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A host given ca.pem and its own pair from different `splitleak certs` runs started, and
    every handshake failed, told only on the other side (a label party's own mixed directory:
    each party said the label party refused its certificate)."""
    other = tmp_path / "other"
    tls.generate(other, tls.identities(1))
    shutil.copy(other / "ca.pem", certs / "ca.pem")
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, certs, tls.LABEL_PARTY)
    message = capsys.readouterr().err
    assert f"label-party.pem is not signed by the CA beside it, {certs / 'ca.pem'}" in message, message
    assert "splitleak certs" in message, message


def test_a_key_of_another_identity_is_named(certs: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(certs / "attacker.key", certs / "label-party.key")
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, certs, tls.LABEL_PARTY)
    message = capsys.readouterr().err
    assert "label-party.key is not the private key of the certificate" in message, message


@pytest.mark.parametrize("role", [tls.LABEL_PARTY, tls.passive_identity(1)])
def test_another_identitys_pair_under_this_ones_name_is_refused_at_start(
        certs: Path, role: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The attacker's pair copied as this role's (files mixed up while handing them out): it
    started; each passive party then said the label party 'is not this run's label party ...
    check --label-party', or the label party refused the passive party's join."""
    for suffix in (".pem", ".key"):
        shutil.copy(certs / f"{tls.ATTACKER}{suffix}", certs / f"{role}{suffix}")
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, certs, role)
    message = capsys.readouterr().err
    hosts = ", host names attacker, localhost" if role == tls.LABEL_PARTY else ""
    assert f"{role}.pem is not a certificate of {role!r} (common name 'attacker'{hosts})" \
        in message, message
    assert "splitleak certs" in message, message


def _certificate(common: str, *alt: x509.GeneralName) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    made = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(
        NameOID.COMMON_NAME, common)])).issuer_name(x509.Name([x509.NameAttribute(
            NameOID.COMMON_NAME, "ca")])).public_key(key.public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1)))
    if alt:
        made = made.add_extension(x509.SubjectAlternativeName(list(alt)), critical=False)
    return made.sign(key, hashes.SHA256())


@pytest.mark.parametrize(("name", "alt"), [
    (tls.passive_identity(1), [x509.DNSName("node3.lab.example")]),  # made for its host
    (tls.LABEL_PARTY, [x509.DNSName("Label-Party")]),  # host names match in any case
    (tls.LABEL_PARTY, []),
])
def test_an_identity_its_peers_admit_and_dial_is_taken(name: str, alt: list) -> None:
    """A passive party's certificate made by hand for its host (CN passive-party-1, host name
    node3.lab.example) was refused, though nobody dials a passive party; and 'Label-Party'."""
    tls.certifies(Path("x.pem"), _certificate(name, *alt), name)


def test_a_server_identity_with_addresses_alone_is_refused() -> None:
    """A label party's certificate whose host names are an address alone was taken, then
    failed every party's handshake (they dial it by the name label-party)."""
    import ipaddress

    certificate = _certificate(tls.LABEL_PARTY, x509.IPAddress(ipaddress.ip_address("10.0.0.5")))
    with pytest.raises(tls.IdentityError, match=r"x.pem is not a certificate of 'label-party' "
                       r"\(common name 'label-party', host names none \(only addresses\)\)"):
        tls.certifies(Path("x.pem"), certificate, tls.LABEL_PARTY)


@pytest.mark.parametrize(("days_ago", "said"), [(40, "expired on"),
                                                (-5, "is not valid before")])
def test_an_identity_outside_its_validity_window_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        days_ago: int, said: str) -> None:
    _generate_at(tmp_path / "certs", days_ago, monkeypatch)
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, tmp_path / "certs", tls.passive_identity(1))
    message = capsys.readouterr().err
    assert f"ca.pem {said}" in message and "UTC" in message, message
    assert "splitleak certs" in message, message


def test_identities_made_on_a_host_whose_clock_is_ahead_serve_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak certs` on a trusted machine whose clock runs 10 minutes ahead of a party's
    host: every identity was refused there as 'not valid before' until that host's clock
    caught up."""
    _generate_at(tmp_path / "certs", -10 / (24 * 60), monkeypatch)
    assert tls_dir_or_exit(None, tmp_path / "certs", tls.LABEL_PARTY) == tmp_path / "certs"


def test_the_sidecar_refuses_a_garbage_certificate_at_once(certs: Path, tmp_path: Path) -> None:
    """It said 'cannot listen on ...: gRPC could not bind it' for a free port."""
    (certs / "attacker.pem").write_text("junk\n")
    result = subprocess.run([sys.executable, "-m", "attacker", "serve", "--listen", "127.0.0.1:0",
                             "--out", str(tmp_path / "out"), "--tls-dir", str(certs)],
                            capture_output=True, text=True, timeout=scaled(60))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert "attacker.pem is not a PEM certificate" in result.stderr, result.stderr
    assert "cannot listen" not in result.stderr and "Traceback" not in result.stderr


async def _serving(certs: Path | None, identity: str, host: str = "127.0.0.1") -> tuple[object, str]:
    server = create_server(TopologyConfig())
    from grpc_health.v1 import health, health_pb2_grpc

    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = bind(server, f"{host}:0", certs, identity)
    await server.start()
    return server, f"{host}:{port}"


def _tap_against(tap_certs: Path | None, server_certs: Path,
                 server_identity: str) -> tuple[float, str]:
    """Passive party 1's tap (identities `tap_certs`; None: plaintext) started against a server serving as
    `server_identity`: the seconds until it failed and its message."""
    async def go() -> tuple[float, str]:
        server, address = await _serving(server_certs, server_identity)
        tap = Tap(address, AttackerConfig(), TopologyConfig(join_deadline_s=60), tap_certs,
                  tls.passive_identity(1))
        started = time.monotonic()
        try:
            with pytest.raises(TapError) as err:
                await tap.start("run", 1)
            return time.monotonic() - started, str(err.value)
        finally:
            await tap.channel.close()
            await server.stop(0)  # type: ignore[attr-defined]

    return asyncio.run(go())


def test_a_tap_dialling_another_role_fails_at_once(certs: Path) -> None:
    """The label party's address given as the sidecar's: it waited the join deadline, then
    said 'not reachable'."""
    seconds, message = _tap_against(certs, certs, tls.LABEL_PARTY)
    assert seconds < scaled(15), (seconds, message)
    assert "is not this run's attacker sidecar" in message, message
    assert "--attacker" in message, message


def test_a_tap_dialling_another_runs_sidecar_names_the_ca_it_checked(certs: Path,
                                                                     tmp_path: Path) -> None:
    """A sidecar of another `splitleak certs`: the tap said 'its TLS certificate was refused
    (... certificate signature failure ...)' and 'this run's ca.pem', not which file."""
    others = tmp_path / "others"
    tls.generate(others, tls.identities(1))
    seconds, message = _tap_against(certs, others, tls.ATTACKER)
    assert seconds < scaled(15), (seconds, message)
    assert f"its TLS certificate is not signed by {certs / 'ca.pem'}" in message, message
    assert "--attacker" in message and "splitleak certs" in message, message


def test_a_plaintext_tap_names_a_tls_sidecar_at_once(certs: Path) -> None:
    """A party started with topology.tls = false tapping a TLS sidecar: it waited the join
    deadline, then said 'attacker sidecar ... is not reachable'."""
    seconds, message = _tap_against(None, certs, tls.ATTACKER)
    assert seconds < scaled(15), (seconds, message)
    assert "attacker sidecar at 127.0.0.1:" in message, message
    assert "closes every plaintext connection: it speaks TLS" in message, message
    assert "not reachable" not in message, message


def _party_against(tmp_path: Path, certs: Path | None,
                   server_certs: Path | None) -> tuple[float, str]:
    from passive_party.client import PartyError, run_party
    from splitleak.artifacts.paths import RunDir

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1, "tls": certs is not None,
                                              "join_deadline_s": 60}))

    async def go() -> tuple[float, str]:
        server, address = await _serving(server_certs, tls.LABEL_PARTY)
        started = time.monotonic()
        try:
            with pytest.raises(PartyError) as err:
                await run_party(cfg, 1, address, RunDir(tmp_path / "run"), tls_dir=certs)
            return time.monotonic() - started, str(err.value)
        finally:
            await server.stop(0)  # type: ignore[attr-defined]

    return asyncio.run(go())


def test_an_expired_label_party_certificate_is_named_as_expired(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said 'not this run's label party'. Both sides' own start checks are bypassed to
    reach the handshake: the label party would refuse to start with it."""
    _generate_at(tmp_path / "certs", 40, monkeypatch)
    monkeypatch.setattr(tls, "check", lambda *args: None)
    seconds, message = _party_against(tmp_path, tmp_path / "certs", tmp_path / "certs")
    assert seconds < scaled(15), (seconds, message)
    assert "presents a TLS certificate outside its validity window" in message, message
    assert "certificate has expired" in message and "not this run's" not in message, message


def test_a_plaintext_label_party_is_named_as_plaintext(tmp_path: Path, certs: Path) -> None:
    seconds, message = _party_against(tmp_path, certs, None)
    assert seconds < scaled(15), (seconds, message)
    assert "speaks plaintext, this party was started with TLS" in message, message


def test_a_plaintext_party_names_a_tls_label_party(tmp_path: Path, certs: Path) -> None:
    """It waited its join deadline, then said UNAVAILABLE: ... Socket closed."""
    seconds, message = _party_against(tmp_path, None, certs)
    assert seconds < scaled(15), (seconds, message)
    assert "closes every plaintext connection: it speaks TLS, this party was started without it" \
        in message, message


def _own_pair_of_another_run(tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Passive party 1's host given the run's ca.pem but its own pair from another run (its own
    start check, which refuses such a pair, bypassed: the server's side is what is tested)."""
    monkeypatch.setattr(tls, "signed_by", lambda *args: None)
    other = tmp_path / "other"
    tls.generate(other, tls.identities(1))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(certs / "ca.pem", mixed / "ca.pem")
    for suffix in (".pem", ".key"):
        shutil.copy(other / f"passive-party-1{suffix}", mixed / f"passive-party-1{suffix}")
    return mixed


def test_a_party_whose_own_identity_is_another_runs_is_told_at_once(
        tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's ca.pem but this party's pair from another `splitleak certs`: the label party
    refuses the party's certificate after the handshake. It waited its join deadline in
    silence, then said UNAVAILABLE: ... Socket closed."""
    seconds, message = _party_against(tmp_path, _own_pair_of_another_run(tmp_path, certs, monkeypatch), certs)
    assert seconds < scaled(15), (seconds, message)
    assert "refused this party's certificate" in message, message
    assert "passive-party-1.pem" in message and "splitleak certs" in message, message


def test_a_tap_whose_own_identity_is_another_runs_is_told_at_once(
        tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for the label party: the sidecar refuses the tap's certificate after the handshake;
    the tap waited its join deadline in silence, then said 'not reachable'."""
    seconds, message = _tap_against(_own_pair_of_another_run(tmp_path, certs, monkeypatch), certs,
                                    tls.ATTACKER)
    assert seconds < scaled(15), (seconds, message)
    assert "refused this party's certificate" in message, message
    assert "passive-party-1.pem" in message, message


def test_a_party_whose_label_party_never_answers_says_where_it_looked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A --label-party where nothing listens: the party waited its join deadline without a
    word, then said 'label party refused or failed while joining: UNAVAILABLE: ...'."""
    from passive_party.client import PartyError, run_party
    from splitleak.artifacts.paths import RunDir

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1, "tls": False,
                                              "join_deadline_s": 1}))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with caplog.at_level("INFO", "passive_party"), pytest.raises(PartyError) as err:
            asyncio.run(run_party(cfg, 1, address, RunDir(tmp_path / "run")))
    finally:
        server.close()
    assert f"waiting up to 1 s (topology.join_deadline_s) for the label party at {address}" \
        in caplog.text, caplog.text
    message = str(err.value)
    assert f"no label party answered at {address} within topology.join_deadline_s = 1 s" \
        in message and "--label-party" in message and "refused or failed" not in message, message


def test_a_tap_whose_sidecar_never_answers_says_it_waits(caplog: pytest.LogCaptureFixture) -> None:
    """A party whose --attacker is not serving (yet) waited its join deadline without a word
    after joining: it looked like a hang."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    address = f"127.0.0.1:{server.getsockname()[1]}"

    async def go() -> str:
        tap = Tap(address, AttackerConfig(), TopologyConfig(join_deadline_s=1, tls=False))
        try:
            with pytest.raises(TapError) as err:
                await tap.start("run", 1)
            return str(err.value)
        finally:
            await tap.channel.close()

    try:
        with caplog.at_level("INFO", "splitleak.tap"):
            message = asyncio.run(go())
    finally:
        server.close()
    assert f"waiting up to 1 s (topology.join_deadline_s) for the attacker sidecar at {address}" \
        in caplog.text, caplog.text
    assert f"attacker sidecar at {address} is not reachable (waited 1 s)" in message, message


def test_a_health_probe_names_a_tls_or_plaintext_mismatch(certs: Path) -> None:
    """`splitleak health` said 'UNAVAILABLE: ... Socket closed' for a plaintext probe of a TLS
    server, and gRPC's raw handshake error for a TLS probe of a plaintext one."""
    from splitleak.health import probe

    # probe() runs its own event loop: hold each server in a thread's loop while it probes
    def probed(server_certs: Path | None, probe_certs: Path | None) -> str:
        import threading

        ready: dict[str, object] = {}
        done = threading.Event()

        async def hold() -> None:
            server, address = await _serving(server_certs, tls.LABEL_PARTY)
            ready["address"] = address
            while not done.is_set():
                await asyncio.sleep(0.02)
            await server.stop(0)  # type: ignore[attr-defined]

        thread = threading.Thread(target=asyncio.run, args=(hold(),))
        thread.start()
        try:
            end = time.monotonic() + scaled(30)
            while "address" not in ready:
                assert thread.is_alive() and time.monotonic() < end, "the server never listened"
                time.sleep(0.02)
            ok, line = probe(str(ready["address"]), timeout=scaled(5), tls_dir=probe_certs,
                             identity=tls.LABEL_PARTY)
            assert not ok, line
            return line
        finally:
            done.set()
            thread.join(scaled(10))

    line = probed(certs, None)
    assert "it speaks TLS" in line or "as a server speaking TLS closes a plaintext one" in line, line
    assert "--tls-dir" in line and "Socket closed" not in line, line
    line = probed(None, certs)
    assert "it speaks plaintext (topology.tls = false), this probe used TLS" in line, line
    assert "SSL_ERROR" not in line, line
    # Another run's identities on the probe's side: it printed gRPC's "UNAVAILABLE: failed to
    # connect to all addresses; last error: UNKNOWN: ... certificate signature failure: OK".
    other = certs.parent / "other"
    tls.generate(other, tls.identities(1))
    line = probed(certs, other)
    assert f"not signed by {other / 'ca.pem'}" in line and "splitleak certs" in line, line
    assert "failed to connect to all addresses" not in line, line


def test_a_host_asked_for_an_identity_it_lacks_names_the_ones_it_holds(
        tmp_path: Path, certs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The label party's host (ca.pem and its own pair only) asked for the attacker's identity,
    as the health probe's default: it named the missing files, not what the host does hold."""
    host = tmp_path / "label-host"
    host.mkdir()
    for name in ("ca.pem", "label-party.pem", "label-party.key"):
        shutil.copy(certs / name, host / name)
    with pytest.raises(BadInput):
        tls_dir_or_exit(None, host, tls.ATTACKER)
    message = capsys.readouterr().err
    assert "missing" in message and "holds the identities label-party" in message, message


@pytest.mark.parametrize("role", [tls.LABEL_PARTY, tls.ATTACKER])
def test_a_health_probe_of_the_hosts_own_address_passes(certs: Path, role: str) -> None:
    """`splitleak health HOST:PORT --tls-dir` of a role by its host's own name or address (any
    but localhost and 127.0.0.1, the only ones its certificate names) said "Hostname
    Verification Check failed": the probe, unlike the parties, did not pin the server's role."""
    from splitleak.health import check

    async def go() -> str:
        server, address = await _serving(certs, role, host="127.0.0.2")
        try:
            return await check(address, timeout=scaled(5), tls_dir=certs, identity=tls.LABEL_PARTY)
        finally:
            await server.stop(0)  # type: ignore[attr-defined]

    assert asyncio.run(go()) == "SERVING"


def test_a_health_probe_tries_its_own_role_first(certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar's healthcheck (identity attacker, every 5 s) dialled it as `label-party` first:
    each probe left gRPC's 'No match found for server name' ERROR line in the sidecar's log."""
    from splitleak import health

    tried: list[str | None] = []
    real = health.create_channel

    def recording(*args: Any, server_identity: str | None = None, **kwargs: Any) -> Any:
        tried.append(server_identity)
        return real(*args, server_identity=server_identity, **kwargs)

    monkeypatch.setattr(health, "create_channel", recording)

    async def go() -> str:
        server, address = await _serving(certs, tls.ATTACKER)
        try:
            return await health.check(address, timeout=scaled(5), tls_dir=certs,
                                      identity=tls.ATTACKER)
        finally:
            await server.stop(0)  # type: ignore[attr-defined]

    assert asyncio.run(go()) == "SERVING"
    assert tried == [tls.ATTACKER], tried
