#!/bin/bash
# On a GPU node: doctor, every lesson at -n 1 --device gpu on both APIs, the NP-2 lessons'
# refusal on one GPU, lesson 05 --bench, and the GPU-path tests. Logs and results JSON go to
# $OUT (default /tmp/gpu-node): log.txt, summary.txt (one line per run), pytest.txt, runs.tgz.
#
# Where `make setup` ran on the node, it uses .venv (or TUTOR_PYTHON). On a node that reaches no
# package registry but has CUDA torch and CuPy in its python3, stage wheels here first, into .whl/
# (ignored by git), for that python's version (cp312 below) and carry .whl and this file over:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux1_x86_64 \
#     -d .whl mpich==5.0.2 mpi4py==4.1.2 typer==0.29.1 pydantic pydantic_core annotated-types \
#     typing-inspection typing_extensions annotated-doc rich   (the versions requirements.txt pins)
# then WHEELS=1 tests/gpu_node.sh makes /tmp/gpu-venv from them (tests/node_venv.sh).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-node}
mkdir -p "$OUT/runs"
L=$OUT/log.txt
T0=$(date +%s)
if [ "${WHEELS:-}" = 1 ]; then
  TUTOR_PYTHON=$(tests/node_venv.sh /tmp/gpu-venv mpich 2>>"$L") || exit 3
  export TUTOR_PYTHON
fi
PY=${TUTOR_PYTHON:-.venv/bin/python}
export PYTHONUNBUFFERED=1 COLUMNS=100
{ echo "== machine"; nvidia-smi -L
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, cupy, mpi4py; print('torch', torch.__version__, 'cupy', cupy.__version__,
'mpi4py', mpi4py.__version__, 'cuda', torch.cuda.is_available())"
  echo "== doctor"; timeout 120 bin/tutor doctor; echo "doctor rc=$?"
} >>"$L" 2>&1

one() {  # LESSON API: one run at -n 1 on the GPU, its verdict line
  local f=$OUT/runs/$1-$2 t
  t=$(date +%s)
  timeout 170 bin/tutor run "$1" -n 1 --device gpu --api "$2" --json "$f.json" >"$f.txt" 2>&1
  local rc=$?
  echo "$1 $2 rc=$rc $(( $(date +%s) - t ))s :: $(grep -E '^(PASS|FAIL|BLOCKED|TIMEOUT|CRASH)' \
    "$f.txt" | tail -1 | cut -c1-70)$(grep '^tutor:' "$f.txt" | head -1 | cut -c1-90)"
}
export -f one
export OUT
for f in lessons/[0-9][0-9]_*.py; do
  n=$(basename "$f" | cut -c1-2); echo "$n mpi4py $n torch"
done \
  | xargs -n 2 -P "${PAR:-6}" bash -c 'one "$0" "$1"' | sort > "$OUT/summary.txt"
for n in 01 02 14; do  # NP 2 on one GPU: NCCL wants a GPU per rank, so the runner must refuse
  timeout 120 bin/tutor run $n -n 2 --device gpu >"$OUT/runs/$n-np2.txt" 2>&1
  echo "$n np2 rc=$? :: $(tail -1 "$OUT/runs/$n-np2.txt" | cut -c1-90)" >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt" >> "$L"
for a in mpi4py torch; do
  timeout 200 bin/tutor run 05 -n 1 --device gpu --api $a -- --bench \
    >"$OUT/runs/05-bench-$a.txt" 2>&1
  echo "05 --bench $a rc=$?" >> "$L"
done
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_gpu_double.py \
  tests/test_gpu_reading.py tests/test_gpu_path.py > "$OUT/pytest.txt" 2>&1
echo "gpu tests rc=$? :: $(tail -1 "$OUT/pytest.txt")" >> "$L"
echo "total $(( $(date +%s) - T0 ))s" >> "$L"
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
tail -n 25 "$L"
