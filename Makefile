# the collectives tutor: thin targets, each one line into bin/tutor or pytest
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
# TUTOR_PYTHON=/path/to/python: your own environment (a cluster's torch, CuPy, and the mpi4py built
# for its MPI): no .venv is made, that Python runs everything, and mpiexec comes from MPIEXEC or PATH
TUTOR_PYTHON ?=
PY     := $(if $(TUTOR_PYTHON),$(TUTOR_PYTHON),$(VENV)/bin/python)
SETUP  := $(if $(TUTOR_PYTHON),own-python,$(STAMP))
export TUTOR_PYTHON
NP     ?=
API    ?=
DEVICE ?=
ARGS   ?=
LESSON ?=
# pytest workers for make test / test-torch (pytest-xdist): two keep both cores of a small machine busy
# while one run's ranks start up; more oversubscribe the cores that the timed lessons measure
TEST_JOBS ?= 2
# (TUTOR_PYTHON without pytest-xdist: one worker)
XDIST  = $(if $(filter-out 0 1,$(TEST_JOBS)),$(shell $(PY) -c 'import xdist' 2>/dev/null && printf -- '-n %s --dist loadgroup' $(TEST_JOBS)))

RUN_FLAGS = $(if $(NP),-n $(NP)) $(if $(API),--api $(API)) $(if $(DEVICE),--device $(DEVICE))

.PHONY: help setup own-python check check-mine test test-torch test-nodes clean
.DEFAULT_GOAL := help

help:  ## list the targets
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

setup: $(SETUP)  ## create .venv and install requirements (re-runs pip only when they change)

# a .venv made before the kit moved to CUDA 13 holds cupy-cuda12x and nvidia-nccl-cu12: make it anew
# rather than uninstall them (nvidia-nccl-cu12 shares its libnccl.so.2 file with torch's NCCL)
$(STAMP): requirements.txt requirements-gpu.txt
	@if [ -x $(PY) ] && $(PY) -m pip show -q cupy-cuda12x nvidia-nccl-cu12 >/dev/null 2>&1; then \
	  echo "setup: .venv holds the CUDA 12 CuPy/NCCL this kit no longer uses: making .venv anew"; \
	  rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	if nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --disable-pip-version-check -q -r requirements-gpu.txt; fi
	touch $(STAMP)

own-python:  # TUTOR_PYTHON is set: check it can run the kit, install nothing
	@$(PY) -c "import mpi4py, numpy, typer, yaml" || { echo "setup: $(PY) lacks mpi4py, numpy, typer or \
	pyyaml: install them there (pip install mpi4py numpy typer pyyaml pytest pytest-timeout pytest-xdist)"; exit 2; }

lesson-%: $(SETUP)  ## run one lesson: make lesson-05 NP=4 API=torch DEVICE=cpu ARGS="--count 1000"
	bin/tutor run $* $(RUN_FLAGS) $(if $(ARGS),-- $(ARGS))

check: $(SETUP)  ## every lesson x every NP in its YAML check list x every API: make check DEVICE=gpu
	bin/tutor check $(if $(DEVICE),--device $(DEVICE))

check-mine: $(SETUP)  ## check your practice copy: make check-mine LESSON=05 [NP=4]
	bin/tutor check $(LESSON) --mine $(if $(NP),-n $(NP)) $(if $(API),--api $(API)) $(if $(DEVICE),--device $(DEVICE))

test: $(SETUP)  ## the test suite (unit, runner, real mpiexec runs) but runs loading torch per rank
	$(PY) -m pytest -q $(XDIST) -m "not torch and not twonode"

test-torch: $(SETUP)  ## the runs that load torch on every rank (--api torch, lesson 08): CI runs them too
	$(PY) -m pytest -q $(XDIST) -m torch

test-nodes: $(SETUP)  ## every lesson on two nodes of 2 ranks (network namespaces, a private bridge; root)
	$(PY) -m pytest -q -p no:xdist -m twonode

clean:  ## remove the venv, caches and results
	rm -rf $(VENV) .pytest_cache results .tutor
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
