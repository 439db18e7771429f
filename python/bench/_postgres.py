"""A throwaway PostgreSQL server for the saver benchmark: initialized in a temporary
directory, listening on a free loopback port with ``fsync=on`` and ``synchronous_commit=on``,
and stopped by its process id when the block ends, whether it ends well or not."""

from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Optional

BINARIES = ("initdb", "postgres")
READY_SECONDS_MAX = 60
# The server refuses to run as root; as root, it runs as this user.
SERVER_USER = "postgres"


def missing() -> Optional[str]:
    """Why no server can be started here, or None if one can."""
    absent = [name for name in BINARIES if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not on PATH"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _user() -> Optional[str]:
    return SERVER_USER if os.geteuid() == 0 else None


@contextlib.contextmanager
def server() -> Iterator[str]:
    """Starts a server for the block; yields its connection string (database ``postgres``)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="saver-bench-pg-"))
    try:
        if (user := _user()) is not None:
            record = pwd.getpwnam(user)
            os.chown(root, record.pw_uid, record.pw_gid)
        data, port = root / "data", _free_port()
        subprocess.run(["initdb", "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True, user=_user())
        with open(root / "server.log", "wb") as log:
            process = subprocess.Popen(
                ["postgres", "-D", str(data), "-p", str(port), "-k", str(root), "-c", "listen_addresses=127.0.0.1",
                 "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "max_connections=64"],
                stdout=subprocess.DEVNULL, stderr=log, user=_user(),
            )
        try:
            conninfo = f"host=127.0.0.1 port={port} user=bench dbname=postgres"
            _wait_ready(conninfo, process)
            yield conninfo
        finally:
            process.send_signal(signal.SIGINT)  # Fast shutdown: roll back sessions, checkpoint, exit.
            try:
                process.wait(timeout=READY_SECONDS_MAX)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(conninfo: str, process: subprocess.Popen[bytes]) -> None:
    import psycopg

    deadline = time.monotonic() + READY_SECONDS_MAX
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited with status {process.returncode} before accepting connections")
        try:
            psycopg.connect(conninfo, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
