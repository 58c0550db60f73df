#!/usr/bin/env bash
# The GPU check on a bare GPU machine that reaches no package registry, in one go:
#   scripts/gpu_check.sh OUT_DIR [gpu|graphs|cpu|all] [extra args of scripts/gpu_check.py]
# It uses the machine's own torch. The project's other dependencies come as wheels in .whl/
# (for that machine's Python; docs/gpu.md says which and how to fetch them), installed into
# $SPLITLEAK_SITE (default /tmp/site); the project itself runs from this checkout (PYTHONPATH),
# with its entry points (the plug-in groups) registered there from pyproject.toml. The plain
# single-process loop it compares against is taken from .device/gpu_anchor.py when present.
# Everything it finds goes to OUT_DIR/gpu_check.json (after every section) and
# OUT_DIR/gpu_check.log. Exit 0: every section passed; 1: a section failed; 2: it could not start.
set -uo pipefail
cd "$(dirname "$0")/.."
fail() { echo "gpu_check.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || fail "usage: scripts/gpu_check.sh OUT_DIR [gpu|graphs|cpu|all] [args of scripts/gpu_check.py]"
out=$1
part=${2:-all}
case $part in gpu|graphs|cpu|all) ;; *) fail "part '$part' is none of gpu, graphs, cpu, all";; esac
shift $(( $# >= 2 ? 2 : 1 ))
mkdir -p "$out" || fail "cannot create the output folder $out"
command -v python3 >/dev/null || fail "no python3 on PATH"
site=${SPLITLEAK_SITE:-/tmp/site}
mkdir -p "$site" || fail "cannot create $site for the wheels"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl \
    || fail "pip could not install the wheels in .whl/ into $site (wheels for another Python than $(python3 -V 2>&1)? two versions of one package?)"
fi
export PYTHONPATH=$site:$PWD
# The plug-in groups are entry points (pyproject.toml): a checkout run without installing has
# none, so register them beside the wheels, then check that every dependency is importable.
python3 scripts/gpu_check.py "$out" --prepare "$site" || exit 2
nproc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi: not available"
anchor=()
[ -f .device/gpu_anchor.py ] && anchor=(--anchor .device/gpu_anchor.py)
exec python3 scripts/gpu_check.py "$out" --part "$part" "${anchor[@]}" "$@"
