#!/bin/sh
# One-shot step before a compose run (the only one that runs as root, and it does nothing
# else): check the experiment file, its number of passive parties and that its data files
# are in /data (the SPLITLEAK_DATA folder) and readable by the parties' user, create
# /runs/$SPLITLEAK_RUN_ID owned by that user, and make this run's CA and one TLS identity per
# party in /tls (when topology.tls, the default). A run directory that already holds a run is
# refused, never reused.
set -eu
config=/config/experiment.toml
tls_dir=/tls
run_id=${SPLITLEAK_RUN_ID:?SPLITLEAK_RUN_ID is not set}
run_dir=/runs/$run_id
owner=${SPLITLEAK_UID:-1000}:${SPLITLEAK_GID:-1000}

case $run_id in
    *[!A-Za-z0-9_.-]* | . | .. | "") echo "prepare: SPLITLEAK_RUN_ID='$run_id': use letters, digits, '_', '.', '-'" >&2; exit 2 ;;
esac
if [ ! -f "$config" ]; then
    echo "prepare: no experiment file at $config (SPLITLEAK_CONFIG must name a file on the host;" \
         "a relative path is relative to deploy/)" >&2
    exit 2
fi
if [ -e "$run_dir/config.toml" ] || [ -e "$run_dir/label_party" ] || [ -e "$run_dir/attacker" ]; then
    echo "prepare: runs/$run_id already holds a run; choose another SPLITLEAK_RUN_ID" \
         "(e.g. SPLITLEAK_RUN_ID=run-\$(date +%Y%m%d-%H%M%S)) or remove runs/$run_id" >&2
    exit 1
fi
python - "$config" "${SPLITLEAK_PASSIVE_PARTIES:?}" "$tls_dir" "$owner" <<'PY'
import os
import shutil
import sys
from pathlib import Path

from splitleak.config import ConfigError, load_config
from splitleak.data_files import data_paths

path, expected, tls_dir, owner = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
try:  # the schema only (fast); the label party checks the rest and exits 2 naming the field
    cfg = load_config(path)
except ConfigError as err:
    sys.exit(f"prepare: {err}")
n = cfg.topology.passive_parties
if n != expected:
    fix = ("deploy/docker-compose.yml" if n == 2 else
           f"`python deploy/make_compose.py {n} -o deploy/compose.{n}.yml`")
    sys.exit(f"prepare: the experiment file (SPLITLEAK_CONFIG) says topology.passive_parties = {n} "
             f"but this compose file runs {expected} passive parties: use {fix}, "
             "or change the config")
# A data file must be in the data folder the parties see (SPLITLEAK_DATA at /data): without
# this, prepare passed and the label party then stopped the run saying the file is missing.
for key, where in data_paths(cfg).items():
    if not where.exists():
        given = cfg.dataset.params[key.removeprefix("dataset.params.")]
        looked = "" if str(where) == given else f" (read as {where})"
        inside = Path(given).is_absolute() and Path(given).is_relative_to("/data")
        fix = f"as {Path(given).relative_to('/data')} in" if inside else "in"
        name = "" if inside else f", and name it there, e.g. {key} = \"/data/{Path(given).name}\""
        print(f"prepare: {key} = {given!r}{looked} does not exist inside the containers: put it "
              f"{fix} the host folder SPLITLEAK_DATA (default deploy/data/), which the containers "
              f"see at /data{name}", file=sys.stderr)
        sys.exit(2)
# This step runs as root, the parties as the owner: what they cannot read stopped the label
# party (exit 2) after prepare passed. Open each file as they will (effective ids).
uid, _, gid = owner.partition(":")
files = [f for f in data_paths(cfg).values() if f.is_file()]
if files and uid.isdigit() and gid.isdigit():
    groups, denied = os.getgroups(), None
    os.setgroups([])
    os.setegid(int(gid))
    os.seteuid(int(uid))
    try:
        for file in files:
            file.open("rb").close()
    except OSError as err:
        denied = f"{file} ({err.strerror})"
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)
    if denied:
        print(f"prepare: the parties' user {owner} (SPLITLEAK_UID/GID) cannot read the data file "
              f"{denied}: make it readable on the host (e.g. chmod a+r, and a+x on its folders) "
              "or set SPLITLEAK_UID/SPLITLEAK_GID to its owner's ids", file=sys.stderr)
        sys.exit(2)
# A fresh CA every run; nothing of an earlier run's identities is left behind.
for old in tls_dir.iterdir():
    shutil.rmtree(old) if old.is_dir() else old.unlink()
if cfg.topology.tls:
    from splitleak import tls

    tls.generate(tls_dir, tls.identities(n))
    print(f"prepare: mutual TLS, a new CA and {n + 2} identities")
else:
    print("prepare: topology.tls = false: the parties talk plaintext")
print(f"prepare: config schema ok ({n} passive parties, hash {cfg.hash})")
PY
chown -R "$owner" "$tls_dir"
mkdir -p "$run_dir"
chown "$owner" "$run_dir"
echo "prepare: run directory $run_id ready for uid:gid $owner"
