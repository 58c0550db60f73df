#!/usr/bin/env bash
# The GPU check on a bare GPU machine that reaches no package registry, in one go:
#   scripts/gpu_check.sh OUT_DIR [gpu|graphs|cpu|all] [extra args of scripts/gpu_check.py]
# It uses the machine's own torch. The project's other dependencies come as wheels in .whl/
# (for that machine's Python; docs/gpu.md says which and how to fetch them), installed into
# /tmp/site; the project itself runs from this checkout (PYTHONPATH). The plain single-process
# loop it compares against is taken from .device/gpu_anchor.py when that file is there.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [gpu|graphs|cpu|all] [args]}
part=${2:-all}
shift $(( $# >= 2 ? 2 : 1 ))
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nproc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
anchor=()
[ -f .device/gpu_anchor.py ] && anchor=(--anchor .device/gpu_anchor.py)
exec python3 scripts/gpu_check.py "$out" --part "$part" "${anchor[@]}" "$@"
