"""Every exception class of `continuum.errors`, each raised by a real condition (a real
second process, a real crash, a real flipped byte, a real full disk), and use after close.

Two classes have no test here: `KeyCollisionError` (two keys whose 64-bit hashes collide)
and `PoisonedError` (a failed `fdatasync`); the Rust suite covers both with its simulated
storage, and the mapping to these classes is one line each in `python/src/errors.rs`."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import continuum


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a new Python process with `args` as `sys.argv[1:]`."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=120
    )


def test_hierarchy() -> None:
    for name in continuum.errors.__all__:
        cls = getattr(continuum, name)
        assert issubclass(cls, continuum.Error) or cls is continuum.Failure
    assert issubclass(continuum.KeyCollisionError, continuum.ConflictError)
    assert issubclass(continuum.NoSpaceError, continuum.IoError)
    assert issubclass(continuum.IoError, OSError)
    assert issubclass(continuum.InvalidArgumentError, ValueError)
    assert issubclass(continuum.UnknownRunError, LookupError)
    assert issubclass(continuum.UnknownAtomError, LookupError)


def test_use_after_close_raises_closed_error(store_dir: pathlib.Path) -> None:
    store = continuum.Store(store_dir)
    run = store.create_run("closing")
    atom = store.record_atom(run, "a", "1", [], b"x")
    store.close()
    assert store.closed
    store.close()  # closing twice does nothing
    calls = [
        lambda: store.create_run("again"),
        lambda: store.record_atom(run, "a", "2", [atom], b"y"),
        lambda: store.execute(run, "a", "2", [atom], lambda _: b"y"),
        lambda: store.guarded(atom, "op", lambda _: b"y"),
        lambda: store.atom(atom),
        lambda: store.agent_history(run, "a"),
        lambda: store.rebuild_context(atom),
        lambda: store.metrics(),
        lambda: store.resume(run),
        lambda: store.last_agent_atom(run, "a"),
    ]
    for call in calls:
        with pytest.raises(continuum.ClosedError):
            call()
    # The lock is released: the directory opens again, with the atom in it.
    with continuum.Store(store_dir) as reopened:
        assert reopened.atom(atom).result == b"x"
    assert reopened.closed


def test_locked_by_this_process_and_by_another(store_dir: pathlib.Path) -> None:
    with continuum.Store(store_dir):
        with pytest.raises(continuum.LockedError) as locked:
            continuum.Store(store_dir)
        assert locked.value.path == str(store_dir)
        child = run_child(
            """
            import sys, continuum
            try:
                continuum.Store(sys.argv[1])
            except continuum.LockedError:
                print("locked")
            """,
            str(store_dir),
        )
        assert child.stdout.strip() == "locked", child.stderr


def test_conflict_unknown_invalid_and_finished(store: continuum.Store) -> None:
    run = store.create_run("errors")
    atom = store.record_atom(run, "a", "1", [], b"x")
    with pytest.raises(continuum.ConflictError) as conflict:
        store.record_atom(run, "a", "1", [], b"x")
    assert conflict.value.atom == atom
    with pytest.raises(continuum.UnknownRunError):
        store.record_atom(999, "a", "1", [], b"x")
    with pytest.raises(continuum.UnknownAtomError) as unknown:
        store.atom(12345)
    assert unknown.value.atom == 12345
    with pytest.raises(continuum.InvalidArgumentError) as parent:
        store.record_atom(run, "a", "2", [777], b"x")
    assert parent.value.atom == 777
    with pytest.raises(continuum.InvalidTransitionError) as transition:
        store.complete_atom(atom, b"again")
    assert (transition.value.from_status, transition.value.to_status) == ("completed", "completed")
    with pytest.raises(continuum.GuardNotInDoubtError):
        store.resolve_guard("no such key", b"")
    store.finish_run(run, True)
    with pytest.raises(continuum.RunFinishedError):
        store.record_atom(run, "a", "2", [atom], b"x")
    with pytest.raises(continuum.RunFinishedError):
        store.finish_run(run, True)
    # Every refusal left the store usable and unchanged.
    assert store.run_atoms(run) == [atom]


def test_a_stop_request_refuses_new_atoms_with_stopping_error(store: continuum.Store) -> None:
    run = store.create_run("stopping")
    done = store.record_atom(run, "a", "1", [], b"x")
    begun = store.begin_atom(run, "a", "2", [done])
    assert not store.is_stop_requested()
    assert store.request_stop() is True
    assert store.request_stop() is False, "only the first call makes the request"
    with pytest.raises(continuum.StoppingError) as stopping:
        store.record_atom(run, "a", "3", [done], b"x")
    assert stopping.value.run == run
    # The atom in flight may still end, and a completed step still replays.
    store.complete_atom(begun, b"y")
    assert store.execute(run, "a", "1", [], lambda atom: pytest.fail("replayed steps never run")).replayed
    assert store.run_atoms(run) == [done, begun], "the refused atom wrote nothing"


def test_output_not_recorded_hands_the_output_back(store: continuum.Store) -> None:
    run = store.create_run("not-recorded")

    def completes_itself(atom: int) -> bytes:
        store.complete_atom(atom, b"recorded first")
        return b"mine"

    with pytest.raises(continuum.OutputNotRecordedError) as failed:
        store.execute(run, "a", "1", [], completes_itself)
    assert failed.value.result == b"mine"
    assert isinstance(failed.value.__cause__, continuum.InvalidTransitionError)
    assert store.atom(failed.value.atom).result == b"recorded first"


def test_in_doubt_after_a_crash_inside_the_effect(store_dir: pathlib.Path) -> None:
    child = run_child(
        """
        import os, signal, sys, continuum
        store = continuum.Store(sys.argv[1])
        run = store.create_run("crash-in-effect")
        step = store.record_atom(run, "a", "pay", [], b"")
        store.guarded(step, "charge", lambda key: os.kill(os.getpid(), signal.SIGKILL))
        """,
        str(store_dir),
    )
    assert child.returncode == -9, child.stderr
    calls = []
    with continuum.Store(store_dir) as store:
        run = store.run_id("crash-in-effect")
        (step,) = store.run_atoms(run)
        with pytest.raises(continuum.InDoubtError) as doubt:
            store.guarded(step, "charge", lambda key: calls.append(key) or b"charged twice")
        assert doubt.value.key == store.guard_key(step, "charge")
        store.resolve_guard(doubt.value.key, b"charged once")
        assert store.guarded(step, "charge", lambda key: calls.append(key) or b"charged twice") == b"charged once"
    assert calls == []


def test_corruption_mid_log_is_refused(store_dir: pathlib.Path) -> None:
    with continuum.Store(store_dir) as store:
        run = store.create_run("corrupt")
        parents: list[int] = []
        for step in range(20):
            parents = [store.record_atom(run, "a", str(step), parents, b"y" * 100)]
    (segment,) = store_dir.glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    for mode in ("tolerate_torn_tail", "strict"):
        with pytest.raises(continuum.CorruptionError) as corrupt:
            continuum.Store(store_dir, recovery_mode=mode)
        assert corrupt.value.path == str(segment)
        assert 0 < corrupt.value.offset <= len(data) // 3


def test_history_reclaimed(store_dir: pathlib.Path) -> None:
    with continuum.Store(
        store_dir, segment_bytes=64 * 1024, snapshot_every_atoms=5, snapshots_per_agent=1, background=False
    ) as store:
        run = store.create_run("long")
        parents: list[int] = []
        for step in range(400):
            parents = [store.record_atom(run, "a", str(step), parents, b"", {"state": {"k": b"x" * 300}})]
        store.snapshot_now(parents[0])
        report = store.compact()
        assert report["segments_rewritten"] > 0
        assert report["deltas_reclaimed"] > 0
        assert (report["messages_reclaimed"], report["aborted"]) == (0, False)
        first = store.run_atoms(run)[0]
        with pytest.raises(continuum.HistoryReclaimedError) as reclaimed:
            store.rebuild_context(first)
        assert reclaimed.value.atom == first
        assert store.atom(first).delta_reclaimed
        assert store.rebuild_context(parents[0])["state"] == {"k": b"x" * 300}


def test_read_only_and_io_errors(store_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with continuum.Store(store_dir) as store:
        run = store.create_run("ro")
        atom = store.record_atom(run, "a", "1", [], b"x")
    with continuum.Store(store_dir, read_only=True) as view:
        assert view.atom(atom).result == b"x"
        with pytest.raises(continuum.ReadOnlyError):
            view.record_atom(run, "a", "2", [atom], b"y")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(continuum.IoError) as io:
        continuum.Store(not_a_dir / "store")
    assert isinstance(io.value, OSError)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_no_space_on_a_full_disk(tmp_path: pathlib.Path) -> None:
    """A 256 KiB tmpfs in a private mount namespace fills up: NoSpaceError, then the store still
    finishes the run (the reserve every segment keeps)."""
    mount = tmp_path / "small"
    mount.mkdir()
    code = textwrap.dedent(
        """
        import sys, continuum
        store = continuum.Store(sys.argv[1], segment_bytes=64 * 1024, background=False)
        run = store.create_run("fill")
        parents = []
        try:
            for step in range(100_000):
                parents = [store.record_atom(run, "a", str(step), parents, b"x" * 2000)]
        except continuum.NoSpaceError as error:
            assert isinstance(error, OSError)
            store.finish_run(run, False, "disk full")
            print("no space after", step, "atoms")
        """
    )
    script = tmp_path / "fill.py"
    script.write_text(code)
    shell = f"mount -t tmpfs -o size=256k tmpfs {mount} && exec {sys.executable} {script} {mount}/store"
    child = subprocess.run(["unshare", "-r", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120)
    if child.returncode != 0 and "Traceback" not in child.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {child.stderr.strip()}")
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("no space after"), child.stdout
