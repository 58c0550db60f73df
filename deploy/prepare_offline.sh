#!/usr/bin/env bash
# Prepare an offline image build on a machine with no container registry:
#   1. a Debian base image with python3 + venv, made by debootstrap and `docker import`ed;
#   2. deploy/wheels/: every wheel the image installs, downloaded on the host with pip.
# Then build with:
#   docker build -f deploy/Dockerfile --build-arg BASE_IMAGE=splitleak-base:bookworm \
#                --build-arg WHEELS=deploy/wheels -t splitleak:local .
# Idempotent: an existing base image is kept; wheels already in deploy/wheels are not
# downloaded again. Needs root (debootstrap), a Docker engine, and the Debian mirror and
# the Python package index (or their local mirrors) reachable from the host.
# `prepare_offline.sh --check` changes nothing: exit 0 if both are ready and the wheels
# match pyproject.toml + constraints.txt, else 1 saying what is missing.
#
# Environment (defaults in brackets):
#   SPLITLEAK_BASE_IMAGE  tag of the imported base image [splitleak-base:bookworm]
#   DEBIAN_SUITE          Debian release of the base, its python3 must be 3.11 [bookworm]
#   DEBIAN_MIRROR         [http://deb.debian.org/debian]
#   PYTHON                host Python 3.11 that runs `pip download` [.venv/bin/python, else python3.11]
#   WHEELS_DIR            [deploy/wheels]
set -euo pipefail

cd "$(dirname "$0")/.."
BASE_IMAGE=${SPLITLEAK_BASE_IMAGE:-splitleak-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS_DIR=${WHEELS_DIR:-deploy/wheels}
# The image's Python (bookworm: 3.11); wheels are downloaded for the host's interpreter,
# so the host must run the same minor version on the same architecture.
PY_MINOR=3.11

die() { echo "prepare_offline: error: $*" >&2; exit 1; }
say() { echo "prepare_offline: $*"; }
check_only=false
case ${1:-} in
    --check) check_only=true ;;
    "") ;;
    *) die "unknown argument $1 (usage: prepare_offline.sh [--check])" ;;
esac

command -v docker >/dev/null || die "docker CLI not found (install docker.io)"
docker info >/dev/null 2>&1 || die "no Docker engine reachable (start dockerd, or check DOCKER_HOST)"

# --- 1. base image ----------------------------------------------------------------------
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    $check_only || say "base image $BASE_IMAGE exists, kept"
elif $check_only; then
    missing="base image $BASE_IMAGE"
else
    [ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root or import $BASE_IMAGE yourself"
    command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install -y debootstrap"
    rootfs=$(mktemp -d /tmp/splitleak-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    say "debootstrap $SUITE (minbase + python3, python3-venv) into $rootfs ..."
    if ! debootstrap --variant=minbase --include=python3,python3-venv \
            "$SUITE" "$rootfs" "$MIRROR" > "$rootfs.log" 2>&1; then
        tail -n 20 "$rootfs.log" >&2
        die "debootstrap failed (full log: $rootfs.log); is $MIRROR reachable?"
    fi
    got=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$got" = "$PY_MINOR" ] || die "$SUITE ships python $got, the wheels need $PY_MINOR"
    # What a container never needs: package caches and indexes, docs, man pages.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
           "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    say "importing as $BASE_IMAGE ..."
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs" "$rootfs.log"
    trap - EXIT
    say "base image $BASE_IMAGE imported ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | numfmt --to=iec))"
fi

# --- 2. wheels --------------------------------------------------------------------------
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python$PY_MINOR; fi
fi
command -v "$PYTHON" >/dev/null || die "no host Python $PY_MINOR ($PYTHON); set PYTHON=/path/to/python$PY_MINOR"
host=$("$PYTHON" -c 'import platform, sys; print("%d.%d-%s" % (*sys.version_info[:2], platform.machine()))')
[ "${host%-*}" = "$PY_MINOR" ] || die "$PYTHON is Python ${host%-*}; the image runs $PY_MINOR (set PYTHON)"

# The project's runtime dependencies plus the build backend pip needs to build the project
# itself inside the image (with --no-index there is no other place to get it from).
wanted=$("$PYTHON" -c '
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(project["project"]["dependencies"] + project["build-system"]["requires"]))')
digest=$(printf '%s\n' "$wanted" | cat - constraints.txt | sha256sum | cut -d' ' -f1)
stamp="$WHEELS_DIR/.complete"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    $check_only || say "wheels in $WHEELS_DIR are complete for these requirements, kept"
elif $check_only; then
    missing="${missing:+$missing and }wheels in $WHEELS_DIR for the current pyproject.toml/constraints.txt"
else
    mkdir -p "$WHEELS_DIR"
    requirements="$WHEELS_DIR/requirements.txt"
    printf '%s\n' "$wanted" > "$requirements"
    say "downloading wheels into $WHEELS_DIR ..."
    # --only-binary: nothing is compiled inside the image; pip skips files already there.
    # (The grep drops pip's notes about configured local indexes that lack a package.)
    "$PYTHON" -m pip download --quiet --only-binary=:all: --dest "$WHEELS_DIR" \
        -c constraints.txt -r "$requirements" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
        || die "pip download failed (is the package index reachable from the host?)"
    echo "$digest" > "$stamp"
fi
if $check_only; then
    [ -z "${missing:-}" ] || { echo "prepare_offline: not ready: missing $missing; run deploy/prepare_offline.sh" >&2; exit 1; }
    say "ready (checked)"
    exit 0
fi
count=$(find "$WHEELS_DIR" -name '*.whl' | wc -l)
say "ready: base image $BASE_IMAGE, $count wheels in $WHEELS_DIR ($(du -sh "$WHEELS_DIR" | cut -f1))"
