"""Real crashes: a child Python process records atoms and reports each one the store
acknowledged; the parent kills it with SIGKILL at a random moment, reopens the store and
checks that every acknowledged atom is there, byte for byte, and that `execute` does not run
an acknowledged step again."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import continuum

WRITER = textwrap.dedent(
    """
    import sys, continuum
    store = continuum.Store(sys.argv[1])
    run = store.create_run("crash")
    agent = "writer-" + sys.argv[2]
    mine = [entry for entry in store.resume(run)["agents"] if entry["agent"] == agent]
    completed = mine[0]["completed"] if mine else []
    parents, step = completed[-1:], len(completed)
    while True:
        def work(atom, step=step):
            return (f"result {step}".encode(), {"state": {"step": str(step).encode()}})
        executed = store.execute(run, agent, f"step-{step}", parents, work)
        print(step, executed.atom, flush=True)
        parents, step = [executed.atom], step + 1
    """
)


def crash_once(store_dir: pathlib.Path, generation: int, rng: random.Random) -> list[tuple[int, int]]:
    """Starts a writer, kills it after a random number of acknowledged atoms (or a random
    delay), and returns the (step, atom) pairs it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(store_dir), str(generation % 2)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acknowledged = []
    wanted = rng.randint(1, 60)
    assert child.stdout is not None
    while len(acknowledged) < wanted:
        line = child.stdout.readline()
        if not line:
            break
        step, atom = line.split()
        acknowledged.append((int(step), int(atom)))
    time.sleep(rng.random() * 0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    # Lines written before the kill and not yet read were acknowledged too.
    remaining, stderr = child.communicate()
    for line in remaining.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # The kill cut this line: its atom was never reported, so not counted as acknowledged.
        step, atom = line.split()
        acknowledged.append((int(step), int(atom)))
    assert child.returncode == -signal.SIGKILL, stderr
    return acknowledged


def test_sigkill_mid_run_loses_nothing_acknowledged(store_dir: pathlib.Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    acknowledged: dict[str, list[tuple[int, int]]] = {"writer-0": [], "writer-1": []}
    for generation in range(8):
        acknowledged[f"writer-{generation % 2}"] += crash_once(store_dir, generation, rng)
    with continuum.Store(store_dir) as store:
        run = store.run_id("crash")
        for agent, steps in acknowledged.items():
            assert steps, f"{agent} acknowledged nothing"
            for step, atom in steps:
                found = store.atom(atom)
                assert (found.agent, found.key, found.status) == (agent, f"step-{step}", "completed")
                assert found.result == f"result {step}".encode()
            # Steps continue where each crash left them: one atom per step, no step twice.
            keys = [atom.key for atom in store.agent_history(run, agent) if atom.status == "completed"]
            assert keys == [f"step-{step}" for step in range(len(keys))]
            last_step, last_atom = steps[-1]
            again = store.execute(run, agent, f"step-{last_step}", store.atom(last_atom).parents, lambda _: b"rerun")
            assert again.replayed and again.result == f"result {last_step}".encode()
            assert store.rebuild_context(last_atom)["state"]["step"] == str(last_step).encode()
