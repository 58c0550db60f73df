#!/usr/bin/env bash
# li_tradeoff's wall clock, 920e7e0 (its default local engine) against this checkout (local and
# inprocess engines), interleaved in two rounds; numbers in docs/measurements/.
# Usage, from the repository root: BASE=<a checkout of 920e7e0> OUT=<dir> scripts/li_tradeoff_ab.sh
set -u
NEW=$PWD
BASE=${BASE:?a checkout of 920e7e0}
OUT=${OUT:-/tmp/li_tradeoff_ab}
mkdir -p "$OUT"
run() {  # NAME CHECKOUT [ENGINE]
  local name=$1 checkout=$2 engine=${3:-} dir=$OUT/$1
  rm -rf "$dir"
  local load0 t0 rc t1 load1
  load0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s.%N)
  (cd "$checkout" && PYTHONPATH=$checkout nice -n -15 "$NEW/.venv/bin/python" -m orchestration \
    sweep examples/sweeps/li_tradeoff.toml --output-dir "$dir" --no-progress \
    ${engine:+--engine $engine} > "$OUT/$name.log" 2>&1)
  rc=$?; t1=$(date +%s.%N); load1=$(cut -d' ' -f1 /proc/loadavg)
  echo "$name rc=$rc wall=$(echo "$t1 - $t0" | bc) load=$load0->$load1" | tee -a "$OUT/times.txt"
}
for round in 1 2; do
  run "base$round" "$BASE"
  run "new_inproc$round" "$NEW" inprocess
  run "new_local$round" "$NEW" local
done
