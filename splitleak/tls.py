"""Mutual TLS: one identity (certificate + key) per party, signed by a run's own CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from splitleak.fileio import write_atomically

LABEL_PARTY = "label-party"
ATTACKER = "attacker"
# In a directory of identities made for one run (splitleak run, the Ray engine): each process
# deletes its own private key from disk once it holds it in memory, so a run that ends in any
# way (even its orchestrator killed with SIGKILL) leaves no key behind once its roles started.
RUN_SCOPED = "RUN-SCOPED"
_held: dict[tuple[str, bytes], bytes] = {}  # (key file, its certificate) -> the key, in memory
REMAKE = "make new ones with `splitleak certs DIR --parties N`"
# Identities are valid from this long before they were made: they are made on one machine and
# used on others, whose clocks may run behind it (without this, a host a minute behind refused
# every identity as "not valid before" until its clock caught up).
CLOCK_SKEW = dt.timedelta(hours=1)


class IdentityError(ValueError):
    """A TLS file this process cannot serve with: not PEM, a key that is not the certificate's,
    or a certificate outside its validity window. The message names the file."""


def passive_identity(party_id: int) -> str:
    return f"passive-party-{party_id}"


def identities(passive_parties: int) -> list[str]:
    return [LABEL_PARTY, ATTACKER, *(passive_identity(k) for k in range(1, passive_parties + 1))]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _host(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def generate(directory: Path, names: list[str], days: int = 30, hosts: Iterable[str] = (),
             run_scoped: bool = False) -> None:
    """A fresh CA (`ca.pem`) and `<name>.pem` / `<name>.key` per identity. Each certificate
    is valid for localhost, 127.0.0.1, the identity's own name as a host (compose service) and
    every extra host given (IP addresses or DNS names, e.g. the nodes of a Ray cluster).
    `run_scoped`: the identities serve one run; each process deletes its key once loaded."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / RUN_SCOPED).unlink(missing_ok=True)
    now = dt.datetime.now(dt.UTC)
    start = now - CLOCK_SKEW
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("splitleak run CA"))
          .issuer_name(_name("splitleak run CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    extra = [_host(h) for h in dict.fromkeys(hosts) if h not in ("localhost", "127.0.0.1")]
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        alt_names = x509.SubjectAlternativeName([
            x509.DNSName(name), x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), *extra])
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(alt_names, critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem = _pem_key(key)  # created 0600: never readable by others, not even for a moment
        write_atomically(directory / f"{name}.key", partial(Path.write_bytes, data=pem),
                         mode=0o600)
    if run_scoped:
        (directory / RUN_SCOPED).write_text("These identities serve one run: each process deletes "
                                            "its private key once it has loaded it.\n")


def remove_private_keys(directory: Path) -> list[Path]:
    """Delete the identities' private keys (the certificates stay, to show who took part)."""
    removed = []
    for key in sorted(directory.glob("*.key")):
        key.unlink(missing_ok=True)
        removed.append(key)
    return removed


def hold(directory: Path, name: str, cert: bytes, key: bytes) -> None:
    """Make `name`'s identity loadable from `directory` (which holds ca.pem and `cert` as
    `<name>.pem`) with its private key only in this process's memory, never on disk."""
    _held[(str((directory / f"{name}.key").absolute()), cert)] = key


def claim(directory: Path, name: str) -> None:
    """Load `name`'s identity now, a process's first step: a missing file fails at once (not
    after the data is loaded), and in a run-scoped directory the key file is gone from then on."""
    if not directory.is_dir():
        raise FileNotFoundError(f"the TLS directory {directory} "
                                + ("is a file, not a directory" if directory.exists() else "does not exist"))
    _read(directory, name)


def _read(directory: Path, name: str) -> tuple[bytes, bytes, bytes]:
    ca_file, cert_file, key_file = (directory / "ca.pem", directory / f"{name}.pem",
                                    directory / f"{name}.key")
    cert = cert_file.read_bytes() if cert_file.is_file() else b""
    held = _held.get((str(key_file.absolute()), cert))
    missing = [str(f) for f in (ca_file, cert_file) if not f.is_file()]
    if held is None and not key_file.is_file():
        missing.append(str(key_file))
    if missing:
        held_here = sorted(pem.stem for pem in directory.glob("*.pem")
                           if pem.name != "ca.pem" and pem.with_suffix(".key").is_file())
        here = (f"; {directory} holds the identities {', '.join(held_here)} (a host has only "
                "its own)" if held_here else "")
        raise FileNotFoundError(f"TLS identity {name!r} incomplete; missing: {', '.join(missing)}"
                                f"{here} (make them with `splitleak certs DIR --parties N`)")
    key = held if held is not None else key_file.read_bytes()
    ca = ca_file.read_bytes()
    check(ca_file, ca, cert_file, cert, key_file, key, name)
    if held is None and (directory / RUN_SCOPED).is_file():
        _held[(str(key_file.absolute()), cert)] = key
        key_file.unlink(missing_ok=True)
    return ca, cert, key


def _certificates(path: Path, pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise IdentityError(f"{path} is not a PEM certificate; {REMAKE}") from None


def _in_validity(path: Path, certificate: x509.Certificate, now: dt.datetime) -> None:
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if now < start or now > end:
        state = "expired on" if now > end else "is not valid before"
        date = end if now > end else start
        clock = (f" (this host's clock says {now:%Y-%m-%d %H:%M} UTC: if it is behind the "
                 "machine that made them, set it right)" if now < start else "")
        raise IdentityError(f"{path} {state} {date:%Y-%m-%d %H:%M} UTC (valid from "
                            f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC){clock}; "
                            f"{REMAKE}")


def check(ca_file: Path, ca: bytes, cert_file: Path, cert: bytes, key_file: Path,
          key: bytes, name: str) -> None:
    """Refuse now, naming the file, what gRPC would only refuse later in words of its own
    (an unparsable file: "could not bind"; an expired certificate or another identity's
    certificate: the peer's handshake or join)."""
    authorities, chain = _certificates(ca_file, ca), _certificates(cert_file, cert)
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise IdentityError(f"{key_file} is not a PEM private key without a passphrase; "
                            f"{REMAKE}") from None
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if private.public_key().public_bytes(*raw) != chain[0].public_key().public_bytes(*raw):
        raise IdentityError(f"{key_file} is not the private key of the certificate {cert_file}; "
                            f"{REMAKE}")
    now = dt.datetime.now(dt.UTC)
    for path, certificates in ((ca_file, authorities), (cert_file, chain)):
        for certificate in certificates:
            _in_validity(path, certificate, now)
    signed_by(ca_file, authorities, cert_file, chain[0])
    certifies(cert_file, chain[0], name)


SERVERS = (LABEL_PARTY, ATTACKER)  # identities peers dial; a passive party is only ever a client


def certifies(cert_file: Path, certificate: x509.Certificate, name: str) -> None:
    """Refuse a certificate that is not `name`'s: a peer admits a client by its common name,
    and a server (the label party, the sidecar) is dialled pinned to that name as a host name
    (server_name_option), which a certificate with host names must list (in any case); so
    another identity's pair renamed, or a server's made for a host alone, fails every
    handshake or join. A passive party's host names are never checked: nobody dials it."""
    common = [attribute.value for attribute in
              certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        alt = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        alt = None
    hosts = alt.get_values_for_type(x509.DNSName) if alt is not None else []
    dialled = name not in SERVERS or alt is None or name.lower() in {h.lower() for h in hosts}
    if common == [name] and dialled:
        return
    said = f"common name {', '.join(map(repr, common)) or 'none'}"
    if alt is not None and name in SERVERS:
        said += f", host names {', '.join(hosts) or 'none (only addresses)'}"
    raise IdentityError(f"{cert_file} is not a certificate of {name!r} ({said}): its peers "
                        f"admit this identity by that name as its common name"
                        f"{' and dial it by that host name' if name in SERVERS else ''}; {REMAKE}")


def signed_by(ca_file: Path, authorities: list[x509.Certificate], cert_file: Path,
              certificate: x509.Certificate) -> None:
    """Refuse an identity its own ca.pem did not sign: every peer of this run trusts that CA,
    so each handshake would fail, told only on the other side (a host given ca.pem and its pair
    from different `splitleak certs` runs)."""
    for authority in authorities:
        try:
            certificate.verify_directly_issued_by(authority)
            return
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise IdentityError(f"{cert_file} is not signed by the CA beside it, {ca_file}: they come "
                        "from different `splitleak certs` runs (give each host ca.pem and its "
                        f"own pair from the same one); {REMAKE}")


def server_credentials(directory: Path, name: str) -> grpc.ServerCredentials:
    """Serve as `name`; every client must present a certificate signed by the run's CA."""
    ca, cert, key = _read(directory, name)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=True)


def server_name_option(server_identity: str) -> tuple[str, str]:
    """Pin the server's role: its certificate must name `server_identity`, whatever address
    the channel dials (every identity of a run is valid for localhost, so without this any
    party's certificate could serve as the label party)."""
    return ("grpc.ssl_target_name_override", server_identity)


def channel_credentials(directory: Path, name: str) -> grpc.ChannelCredentials:
    ca, cert, key = _read(directory, name)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=cert)


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the client's verified certificate, or None on a plaintext channel."""
    names = (context.auth_context() or {}).get("x509_common_name")
    return names[0].decode() if names else None
