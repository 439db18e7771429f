#!/usr/bin/env bash
# Every test of continuum: the Rust suite, then the Python package's (python/tests).
#
# The Python side runs in a project-local virtual environment, .venv/ (git-ignored), made on
# first use with the machine's CPython (3.10 or newer, as pytest 9 and the conformance suite
# need; PYTHON overrides `python3`). Its tools
# are pinned in python/requirements-test.txt; the extension is built in release mode and
# installed into it with maturin.
#
# Usage: scripts/test.sh [--python-only] [pytest arguments...]
#   --python-only  skips `cargo test` (for work on the Python package)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rust=true
if [ "${1:-}" = "--python-only" ]; then
    rust=false
    shift
fi

if $rust; then
    echo "== cargo test"
    cargo test --locked
fi

echo "== python: virtual environment (.venv)"
python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
    echo "$python is missing: the Python tests need CPython 3.10 or newer with pip" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    # Debian's python3 ships venv without ensurepip unless python3-venv is installed:
    # virtualenv, from PyPI, makes the same environment then.
    if ! "$python" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        "$python" -m pip install --quiet --user --disable-pip-version-check virtualenv
        "$python" -m virtualenv --quiet .venv
    fi
fi
venv_python="$PWD/.venv/bin/python"
"$venv_python" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt

echo "== python: build the extension (maturin develop --release)"
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
    maturin develop --release --locked --manifest-path python/Cargo.toml

echo "== python: pytest"
"$venv_python" -m pytest python/tests "$@"
