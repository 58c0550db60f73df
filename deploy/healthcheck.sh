#!/bin/sh
# Docker HEALTHCHECK of every role: healthy when this container's gRPC health service
# (at $SPLITLEAK_HEALTH_ADDRESS, e.g. 127.0.0.1:50051) answers SERVING; a role without a
# server (passive party, analysis) leaves the variable empty and is healthy while it runs.
# When the run uses mutual TLS ($SPLITLEAK_TLS_DIR holds a CA), the probe presents this
# container's own identity ($SPLITLEAK_TLS_IDENTITY).
[ -n "${SPLITLEAK_HEALTH_ADDRESS:-}" ] || exit 0
# The probe behind `splitleak health`, called directly: the CLI module imports torch
# (~6 s of CPU per probe), this does not (~0.5 s), and probes run every few seconds.
exec python -c '
import os, sys
from pathlib import Path
from splitleak.health import probe
tls_dir = Path(os.environ.get("SPLITLEAK_TLS_DIR") or "/nonexistent")
tls = tls_dir if (tls_dir / "ca.pem").is_file() else None
ok, message = probe(sys.argv[1], "", 5.0, tls, os.environ.get("SPLITLEAK_TLS_IDENTITY", ""))
print(message)
sys.exit(0 if ok else 1)
' "$SPLITLEAK_HEALTH_ADDRESS"
