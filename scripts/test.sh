#!/usr/bin/env bash
# Every test of continuum: the Rust suite, then the Python package's (python/tests).
#
# The Python side runs in a project-local virtual environment, .venv/ (git-ignored), made on
# first use with the machine's CPython (3.10 or newer, as pytest 9 and the conformance suite
# need; PYTHON overrides `python3`). Its tools
# are pinned in python/requirements-test.txt; the extension is built in release mode and
# installed into it with maturin.
#
# The object storage tests (tests/ship_s3.rs) run against a real S3-compatible server:
# scripts/s3-server.sh installs SeaweedFS into .venv, starts it on 127.0.0.1 with its data in
# target/s3-server/, and this script stops it by its PID when it exits. They fail, rather than
# skip, if it cannot start (CONTINUUM_S3_REQUIRED=1).
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
    echo "== S3-compatible server (SeaweedFS on 127.0.0.1)"
    s3_dir="$PWD/target/s3-server"
    rm -rf "$s3_dir"
    trap 'scripts/s3-server.sh stop "$s3_dir"' EXIT
    export CONTINUUM_S3_REQUIRED=1
    if s3_env=$(scripts/s3-server.sh start "$s3_dir"); then
        eval "$s3_env"
    else
        echo "the S3-compatible server did not start: the object storage tests will fail" >&2
    fi
    echo "== cargo test (with the object-store feature)"
    cargo test --locked --features object-store
    scripts/s3-server.sh stop "$s3_dir"
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
