# the collectives tutor: thin targets, each one line into bin/tutor or pytest
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NP     ?=
API    ?=
DEVICE ?=
ARGS   ?=
LESSON ?=

RUN_FLAGS = $(if $(NP),-n $(NP)) $(if $(API),--api $(API)) $(if $(DEVICE),--device $(DEVICE))

.PHONY: help setup check check-mine test clean
.DEFAULT_GOAL := help

help:  ## list the targets
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

setup: $(STAMP)  ## create .venv and install requirements (re-runs pip only when they change)

$(STAMP): requirements.txt requirements-gpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	if nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --disable-pip-version-check -q -r requirements-gpu.txt; fi
	touch $(STAMP)

lesson-%: $(STAMP)  ## run one lesson: make lesson-05 NP=4 API=torch DEVICE=cpu ARGS="--count 1000"
	bin/tutor run $* $(RUN_FLAGS) $(if $(ARGS),-- $(ARGS))

check: $(STAMP)  ## every lesson x every NP in its YAML check list x every API
	bin/tutor check

check-mine: $(STAMP)  ## check your practice copy: make check-mine LESSON=05 [NP=4]
	bin/tutor check $(LESSON) --mine $(if $(NP),-n $(NP)) $(if $(API),--api $(API))

test: $(STAMP)  ## the test suite (unit, runner, real mpiexec runs)
	$(PY) -m pytest -q

clean:  ## remove the venv, caches and results
	rm -rf $(VENV) .pytest_cache results .tutor
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
