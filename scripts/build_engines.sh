#!/usr/bin/env bash
# Builds llama.cpp's Python binding (llama-cpp-python, pinned) from its sdist for this CPU and installs it: the
# engine tier of the tests (tests/test_llama_cpp.py, marker `engines`) then runs instead of being skipped.
# About 10 minutes on 2 cores (cmake + gcc, no extra flag), 25 MB installed. CI does not run it (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    python -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python -e ".[engines]"
python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed')"
