"""List channels are stored element by element: a `put` writes a list's elements only from
the first position where it differs from the parent checkpoint's list, so a growing message
list costs each step its new message, not the whole list again. Reading a checkpoint (`get_tuple`,
`list`) rebuilds exactly the value that was put: checked against `InMemorySaver` over random
sequences of appends, replacements, truncations, reorderings, in-place changes of mutable
elements, non-list values, forks and reopens. Damaged list records are `CorruptionError`s."""

from __future__ import annotations

import pathlib
import random
from typing import Any, Optional

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer  # noqa: E402

import continuum  # noqa: E402
from continuum._channels import pack, version_key  # noqa: E402
from continuum.langgraph import ContinuumSaver  # noqa: E402

MESSAGE_BYTES = 500


def _chat(saver: ContinuumSaver, thread_id: str, steps: int) -> list[dict[str, Any]]:
    """The chat pattern: each step appends a message dict and bumps a counter; the configs."""
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    messages: list[Any] = []
    versions: dict[str, Any] = {}
    configs = []
    for step in range(steps):
        messages = messages + [{"role": "user", "text": f"{step:05} " + "x" * (MESSAGE_BYTES - 6)}]
        changed = {"messages": step + 1, "turn": step + 1}
        versions = {**versions, **changed}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages, "turn": step}
        checkpoint["channel_versions"] = dict(versions)
        config = saver.put(config, checkpoint, {"step": step}, changed)
        configs.append(config)
    return configs


def _delta_bytes(store: continuum.Store, thread_id: str) -> list[int]:
    run = store.run_id("langgraph:" + thread_id)
    atoms = [store.atom(atom) for atom in store.agent_atoms(run, "ns:")]
    return [sum(len(key) + len(value) for key, value in atom.delta["state"].items()) for atom in atoms]


def test_a_growing_list_costs_each_put_only_its_new_element(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    configs = _chat(saver, "chat", 200)
    sizes = _delta_bytes(store, "chat")
    assert len(sizes) == 200
    assert max(sizes) < MESSAGE_BYTES + 200, sizes[-3:]
    last = saver.get_tuple(configs[-1])
    assert last is not None
    assert len(last.checkpoint["channel_values"]["messages"]) == 200


def test_a_reopened_saver_goes_on_writing_only_new_elements(store_dir: pathlib.Path) -> None:
    with ContinuumSaver.from_path(store_dir) as saver:
        config = _chat(saver, "chat", 20)[-1]
    with ContinuumSaver.from_path(store_dir) as saver:
        tuple_ = saver.get_tuple(config)
        assert tuple_ is not None
        checkpoint = tuple_.checkpoint
        messages = checkpoint["channel_values"]["messages"] + [{"role": "user", "text": "after the reopen"}]
        checkpoint = {**empty_checkpoint(), "channel_values": {"messages": messages, "turn": 20},
                      "channel_versions": {"messages": 21, "turn": 21}}
        saver.put(config, checkpoint, {"step": 20}, {"messages": 21})
        assert _delta_bytes(saver.store, "chat")[-1] < 200
        latest = saver.get_tuple({"configurable": {"thread_id": "chat"}})
        assert latest is not None
        assert latest.checkpoint["channel_values"]["messages"] == messages


def test_listed_rows_share_elements_and_never_change_what_get_tuple_reads(store: continuum.Store) -> None:
    saver = ContinuumSaver(store)
    _chat(saver, "chat", 10)
    rows = list(saver.list({"configurable": {"thread_id": "chat"}}))
    newest, older = rows[0].checkpoint["channel_values"]["messages"], rows[1].checkpoint["channel_values"]["messages"]
    assert newest is not older
    assert newest[0] is older[0]  # Each stored element is deserialized once per `list`.
    newest[0]["text"] = "changed by the caller"
    newest.append("appended by the caller")
    assert len(older) == 9
    again = saver.get_tuple(rows[1].config)
    assert again is not None
    assert again.checkpoint["channel_values"]["messages"][0]["text"].startswith("00000 ")


class _XorCipher:
    """A toy cipher (``CipherProtocol``) with a random nonce, as real ones have: the same
    plaintext encrypts to different bytes at every call."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        nonce = random.randrange(1, 256)
        return "xor", bytes([nonce]) + bytes(byte ^ nonce for byte in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(byte ^ ciphertext[0] for byte in ciphertext[1:])


def test_an_encrypting_serde_encrypts_every_element_and_still_writes_only_new_ones(
    store_dir: pathlib.Path,
) -> None:
    serde = EncryptedSerializer(_XorCipher())
    with continuum.Store(store_dir) as store:
        configs = _chat(ContinuumSaver(store, serde=serde), "secret", 30)
    with continuum.Store(store_dir) as store:
        saver = ContinuumSaver(store, serde=serde)
        resumed = saver.get_tuple(configs[-1])
        assert resumed is not None
        messages = resumed.checkpoint["channel_values"]["messages"] + [{"role": "user", "text": "x" * 100}]
        checkpoint = {**empty_checkpoint(), "channel_values": {"messages": messages},
                      "channel_versions": {"messages": 31, "turn": 30}}
        configs.append(saver.put(configs[-1], checkpoint, {"step": 30}, {"messages": 31}))
        run = store.run_id("langgraph:secret")
        for atom in store.agent_atoms(run, "ns:"):
            for key, value in store.atom(atom).delta["state"].items():
                assert b"xxxxxxxx" not in value, key
                if key.startswith("element:"):
                    assert b"+xor" in value, key
        assert max(_delta_bytes(store, "secret")) < MESSAGE_BYTES + 200
        listed = list(saver.list({"configurable": {"thread_id": "secret"}}))
        assert [len(row.checkpoint["channel_values"]["messages"]) for row in listed] == list(range(31, 0, -1))
        latest = saver.get_tuple(configs[-1])
        assert latest is not None
        assert latest.checkpoint["channel_values"]["messages"] == messages


def _element(rng: random.Random, step: int) -> Any:
    choice = rng.randrange(7)
    if choice == 0:
        return HumanMessage(content=f"question {step}", id=f"h{step}")
    if choice == 1:
        return AIMessage(content=f"answer {step} " + "y" * rng.randrange(50))
    if choice == 2:
        return {"step": step, "tags": [step, str(step)]}
    if choice == 3:
        return ("tuple", step)
    if choice == 4:
        return None
    if choice == 5:
        return step
    return f"text {step}"


def _edit(rng: random.Random, value: Any, step: int) -> Any:
    """A new value for a list channel: appended to, replaced, truncated, reordered, changed in
    place, or not a list; lists are new objects, as LangGraph's reducers make them."""
    if not isinstance(value, list):
        return [_element(rng, step)] if rng.random() < 0.7 else {"not": "a list", "step": step}
    choice = rng.randrange(10)
    if choice < 5 or not value:
        return value + [_element(rng, step) for _ in range(rng.randrange(1, 4))]
    if choice == 5:
        index = rng.randrange(len(value))
        return value[:index] + [_element(rng, step)] + value[index + 1 :]
    if choice == 6:
        return value[: rng.randrange(len(value))]
    if choice == 7:
        return list(reversed(value)) + [_element(rng, step)]
    if choice == 8:
        mutable = [item for item in value if isinstance(item, dict)]
        if mutable:
            mutable[0]["changed in place"] = step  # The same object, changed: it must be re-serialized.
        return list(value)
    return f"a string at step {step}"


class _Model:
    """The checkpoints put so far, for choosing parents."""

    def __init__(self) -> None:
        self.stored: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []

    def parent(self, rng: random.Random) -> tuple[Optional[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        """(config, values, versions) of the checkpoint to go on from."""
        if not self.stored or rng.random() < 0.05:
            return None, {"messages": [], "notes": [], "turn": 0}, {}
        config, values, versions = self.stored[-1] if rng.random() < 0.8 else rng.choice(self.stored)
        return config, values, versions


def _step(
    rng: random.Random, model: _Model, savers: tuple[ContinuumSaver, InMemorySaver], step: int
) -> None:
    parent, values, versions = model.parent(rng)
    values = dict(values)
    changed: dict[str, Any] = {}
    for channel in ("messages", "notes", "turn"):
        if rng.random() < (0.9 if channel == "messages" else 0.3):
            values[channel] = _edit(rng, values[channel], step) if channel != "turn" else step
            # InMemorySaver's versions: unique across branches, as it needs them to be.
            changed[channel] = savers[1].get_next_version(versions.get(channel), None)
    versions = {**versions, **changed}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(values)
    checkpoint["channel_versions"] = dict(versions)
    base = parent or {"configurable": {"thread_id": "edits", "checkpoint_ns": ""}}
    stored = [saver.put(base, checkpoint, {"step": step}, changed) for saver in savers]
    assert stored[0] == stored[1]
    model.stored.append((stored[0], values, versions))


def _values_by_id(rows: Any) -> dict[str, Any]:
    return {row.config["configurable"]["checkpoint_id"]: row.checkpoint["channel_values"] for row in rows}


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_read_back_as_in_memory_saver(store_dir: pathlib.Path, seed: int) -> None:
    rng = random.Random(seed)
    memory, model = InMemorySaver(), _Model()
    reopen_at = rng.randrange(20, 60)
    for lap in range(2):
        with ContinuumSaver.from_path(store_dir) as saver:
            for step in range(lap * reopen_at, reopen_at if lap == 0 else 80):
                _step(rng, model, (saver, memory), step)
            thread = {"configurable": {"thread_id": "edits"}}
            assert _values_by_id(saver.list(thread)) == _values_by_id(memory.list(thread))
            for config, _, _ in model.stored:
                ours, theirs = saver.get_tuple(config), memory.get_tuple(config)
                assert ours is not None and theirs is not None
                assert ours.checkpoint["channel_values"] == theirs.checkpoint["channel_values"], config


def _damaged_thread(store: continuum.Store, record: bytes, elements: dict[str, bytes]) -> dict[str, Any]:
    """A thread whose latest checkpoint's `messages` record is ``record`` with ``elements``."""
    saver = ContinuumSaver(store)
    config = _chat(saver, "damaged", 1)[-1]
    checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"messages": 9}
    result = pack(*saver._dump(checkpoint), *saver._dump({"step": 1}), b"")
    run = store.run_id("langgraph:damaged")
    state = {"channel:messages": record, **elements}
    store.record_atom(run, "ns:", checkpoint["id"], [], result, {"state": state})
    return {"configurable": {"thread_id": "damaged", "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}


@pytest.mark.parametrize(
    "length, elements",
    [
        (b"2", {"element:messages:0": pack(b"msgpack", b"\xa1a")}),
        (b"x1", {}),
        (b"99999999999", {}),
        (b"1", {"element:messages:0": pack(b"msgpack")}),
        (b"1", {"element:messages:0": pack(b"msgpack", b"\xa1a")[:-3]}),
    ],
)
def test_a_damaged_list_record_is_a_corruption_error(
    store: continuum.Store, length: bytes, elements: dict[str, bytes]
) -> None:
    config = _damaged_thread(store, pack(version_key(9), b"continuum-list", length), elements)
    saver = ContinuumSaver(store)
    with pytest.raises(continuum.CorruptionError):
        saver.get_tuple(config)
    with pytest.raises(continuum.CorruptionError):
        list(saver.list({"configurable": {"thread_id": "damaged"}}))
