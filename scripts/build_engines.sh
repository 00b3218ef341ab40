#!/usr/bin/env bash
# Builds llama.cpp's Python binding (llama-cpp-python, the version pyproject.toml's `engines` extra pins) from its
# sdist for this CPU and installs it: the engine tier of the tests (tests/test_llama_cpp.py, marker `engines`) then
# runs instead of being skipped. CI does not run it (CONTRIBUTING.md).
# Needs a C and C++ compiler (cc, c++: gcc or clang; Debian: apt-get install build-essential); cmake and ninja come
# from PyPI as the sdist's build requirements where none is installed. Measured on machine D (benchmarks/RESULTS.md,
# 2026-11-28): about 10 minutes on one niced core beside other work, 25 MB installed.
# Only the binding and its two helpers are installed: an existing install of hf_posenc (editable or not, from
# whichever checkout) is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cc c++; do
    command -v "$tool" > /dev/null || { echo "error: no $tool on PATH: llama-cpp-python builds llama.cpp from C/C++" \
        "sources (Debian: apt-get install build-essential)" >&2; exit 2; }
done
pins=$(python - <<'PY'
import tomllib
print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["engines"]))
PY
)
# shellcheck disable=SC2086  # the pins are separate requirements
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    python -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python $pins
python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed')"
