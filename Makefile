# mpidp: `make demo` and `make test` set everything up on a machine with only Python 3.10+.
#
#   MPI=wheel  (default) the MPI library comes from the `mpich` wheel on PyPI
#   MPI=system use the MPI library and mpiexec already on the machine
#              (mpi4py is then built against it: needs mpicc on PATH)

PYTHON ?= python3
VENV   ?= .venv
MPI    ?= wheel
NP     ?= 4
PY     := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

ifeq ($(MPI),system)
EXTRAS := test,examples
PIP_MPI := --no-binary mpi4py
else
EXTRAS := mpich,test,examples
PIP_MPI :=
endif
STAMP := $(VENV)/.installed-$(MPI)

.PHONY: setup test demo walkthrough lint bench dropin gpu-check clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PIP_MPI) -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-*
	touch $@

test: $(STAMP)
	$(PY) -m pytest -v --durations=15 tests

demo: $(STAMP)
	mpiexec -n $(NP) $(PY) examples/train_mlp.py

walkthrough: $(STAMP)
	mpiexec -n $(NP) $(PY) examples/ring_walkthrough.py

# On a machine with an NVIDIA GPU: installs CuPy, then checks the CuPy paths on 1-4 ranks.
gpu-check: $(STAMP)
	$(PY) -m pip install --quiet "cupy-cuda12x"
	for n in 1 2 3 4; do timeout 150 mpiexec -n $$n $(PY) examples/gpu_check.py || exit 1; done

lint: $(STAMP)
	$(PY) -m ruff check mpidp tests examples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
