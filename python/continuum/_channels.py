"""How ``ContinuumSaver`` stores a channel version in a checkpoint's delta, and reads it back
from a fold of deltas. Pure: it transforms values and bytes, and calls no store.

A channel version is the state key ``channel:<name>``, whose value packs three parts: the
version (its JSON), a kind and data. The kind is

- a type of the saver's ``serde`` (``dumps_typed``): the data is the whole value;
- ``empty``: the channel has no value (data empty);
- ``continuum-list``: a list stored element by element; the data is its length ``n`` in ASCII
  decimal, and element ``i < n`` is the state key ``element:<name>:<i>`` of the same fold,
  holding ``pack(type, bytes)`` of ``serde.dumps_typed(element)``.

``put`` writes a list's elements only from the first position where it differs from the
channel's list in the parent checkpoint's fold: a list that grew by one message costs one
element and the record, whatever its length. Every other value is written whole. Element keys
past a list's length are stale and never read.
"""

from __future__ import annotations

import functools
import json
import operator
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

import continuum

CHANNEL_PREFIX = "channel:"
ELEMENT_PREFIX = "element:"
EMPTY = b"empty"
LIST = b"continuum-list"
LIST_LENGTH_DIGITS_MAX = 10
# Types whose objects cannot change: the very object serialized before needs no new dump.
_IMMUTABLE = (str, bytes, int, float, bool, type(None))
# Stands for an element object the saver did not serialize itself (read from the store).
_UNKNOWN = object()



def pack(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (u32 little-endian lengths)."""
    return b"".join(struct.pack("<I", len(part)) + part for part in parts)


def unpack(data: bytes) -> list[bytes]:
    """The parts ``pack`` joined."""
    parts, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        at += 4
        parts.append(data[at : at + length])
        at += length
    return parts


def first_part(data: bytes) -> bytes:
    """The first part ``pack`` joined, without copying the others."""
    (length,) = struct.unpack_from("<I", data, 0)
    return data[4 : 4 + length]


@functools.lru_cache(maxsize=4096, typed=True)
def version_key(version: Any) -> bytes:
    """A channel version as stored: its JSON."""
    return json.dumps(version).encode()


def element_key(channel: str, index: int) -> str:
    """The state key of element ``index`` of a list channel."""
    return f"{ELEMENT_PREFIX}{channel}:{index}"


class Element:
    """A list element as a fold holds it: its ``pack(type, bytes)``, and its value once
    ``load_elements`` has deserialized it (then shared by every list of the fold's family
    that holds this element)."""

    __slots__ = ("packed", "value")

    def __init__(self, packed: bytes) -> None:
        self.packed = packed


_VALUE = operator.attrgetter("value")


def load_elements(elements: list[Element], load: Callable[[bytes, bytes], Any]) -> list[Any]:
    """A new list of the elements' values, deserializing only those not loaded yet."""
    try:
        return list(map(_VALUE, elements))
    except AttributeError:
        for element in elements:
            if not hasattr(element, "value"):
                element.value = load(*_element_parts(element.packed))
        return list(map(_VALUE, elements))


def _element_parts(packed: bytes) -> tuple[bytes, bytes]:
    """An element's (type, bytes). Raises ``CorruptionError`` unless it is two parts."""
    try:
        parts = unpack(packed)
    except struct.error:
        parts = []
    if len(parts) != 2 or sum(len(part) for part in parts) + 8 != len(packed):
        raise continuum.CorruptionError(f"a list element of {len(packed)} bytes is not a (type, bytes) pair")
    return parts[0], parts[1]


class ElementCodec:
    """A saver's ``serde`` for list elements: the bytes stored (``pack(type, bytes)``), and the
    bytes that compare two elements. Those are the stored bytes, except under an
    ``EncryptedSerializer``, whose output differs at every call: there they are what its inner
    serde makes of the element, before encryption."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self._serde = serde
        self._plain = serde.serde if isinstance(serde, EncryptedSerializer) else None

    @property
    def keys_are_stored(self) -> bool:
        """Whether an element's comparison bytes are its stored bytes."""
        return self._plain is None

    def whole(self, value: Any) -> tuple[bytes, bytes]:
        """A value's ``(type, bytes)``, as stored."""
        kind, data = self._serde.dumps_typed(value)
        return kind.encode(), data

    def stored(self, item: Any) -> bytes:
        """The element's stored bytes."""
        return pack(*self.whole(item))

    def key(self, item: Any) -> bytes:
        """The element's comparison bytes."""
        if self._plain is None:
            return self.stored(item)
        kind, data = self._plain.dumps_typed(item)
        return pack(kind.encode(), data)

    def key_of_stored(self, packed: bytes) -> bytes:
        """The comparison bytes of a stored element (deserialized and serialized again by the
        inner serde, under encryption)."""
        if self._plain is None:
            return packed
        kind, data = _element_parts(packed)
        return self.key(self._serde.loads_typed((kind.decode(), data)))


@dataclass(frozen=True)
class StoredList:
    """A list channel's value as one fold holds it: each element's stored bytes and its
    comparison bytes (``ElementCodec``), the objects the saver serialized them from
    (``_UNKNOWN`` where it read them), and how many leading objects are of immutable types."""

    elements: tuple[bytes, ...]
    keys: tuple[bytes, ...]
    objects: tuple[Any, ...]
    immutable: int = 0


def encode(
    channel: str, version: Any, value: Any, base: Optional[StoredList], codec: ElementCodec
) -> tuple[dict[str, bytes], Optional[StoredList]]:
    """The state entries that store ``value`` as the channel's ``version``, given the list
    ``base`` the parent's fold holds for the channel (None if it holds no list), and the
    list the new fold holds (None for a value written whole)."""
    if type(value) is not list:
        return {CHANNEL_PREFIX + channel: pack(version_key(version), *codec.whole(value))}, None
    identical = _identical_prefix(value, base)
    elements, keys, shared = _serialize(value, base, codec, identical)
    state = {CHANNEL_PREFIX + channel: pack(version_key(version), LIST, str(len(elements)).encode())}
    for index in range(shared, len(elements)):
        state[element_key(channel, index)] = elements[index]
    stored = tuple(elements)
    return state, StoredList(stored, stored if codec.keys_are_stored else tuple(keys), tuple(value),
                             _immutable_prefix(value, identical))


def _identical_prefix(value: list[Any], base: Optional[StoredList]) -> int:
    """How many leading elements are the very objects of immutable types that ``base`` was
    serialized from (all of ``base``'s immutable prefix, or none): their bytes are ``base``'s."""
    count = min(base.immutable, len(value)) if base is not None else 0
    if count and all(map(operator.is_, value[:count], base.objects[:count])):  # type: ignore[union-attr]
        return count
    return 0


def _immutable_prefix(value: list[Any], known: int) -> int:
    """How many leading elements are of immutable types, given that the first ``known`` are."""
    count = known
    while count < len(value) and type(value[count]) in _IMMUTABLE:
        count += 1
    return count


def _serialize(
    value: list[Any], base: Optional[StoredList], codec: ElementCodec, identical: int
) -> tuple[list[bytes], list[bytes], int]:
    """Each element's stored and comparison bytes, and how many leading elements equal
    ``base``'s: the ``identical`` first reuse ``base``'s bytes, the others are serialized and
    compared byte for byte, and an equal one keeps ``base``'s stored bytes."""
    base_elements = base.elements if base is not None else ()
    base_keys = base.keys if base is not None else ()
    elements, keys = list(base_elements[:identical]), list(base_keys[:identical])
    shared = identical
    for index in range(identical, len(value)):
        key = codec.key(value[index])
        if index == shared and index < len(base_keys) and key == base_keys[index]:
            elements.append(base_elements[index])
            keys.append(base_keys[index])
            shared += 1
            continue
        elements.append(key if codec.keys_are_stored else codec.stored(value[index]))
        keys.append(key)
    return elements, keys, shared


class Fold:
    """The channels of a fold of deltas: each channel's record, and each list channel's
    elements by position (None where the fold holds none). Never changed once built: ``apply``
    returns a new fold that shares the element lists it does not change, and the ``Element``s
    of those it does."""

    __slots__ = ("records", "elements")

    def __init__(self, records: dict[str, bytes], elements: dict[str, list[Optional[Element]]]) -> None:
        self.records = records
        self.elements = elements

    @classmethod
    def of_state(cls, state: Mapping[str, Optional[bytes]]) -> Fold:
        """The fold of a context's ``state`` (``Store.rebuild_context``)."""
        return EMPTY_FOLD.apply(state)

    @classmethod
    def merged(cls, folds: Iterable[Fold]) -> Fold:
        """Folds merged in order, a later one's keys over an earlier one's."""
        records: dict[str, bytes] = {}
        elements: dict[str, list[Optional[Element]]] = {}
        for fold in folds:
            records.update(fold.records)
            for channel, items in fold.elements.items():
                if channel not in elements:
                    elements[channel] = items
                    continue
                merged = list(elements[channel]) + [None] * (len(items) - len(elements[channel]))
                for index, item in enumerate(items):
                    if item is not None:
                        merged[index] = item
                elements[channel] = merged
        return cls(records, elements)

    def apply(self, delta: Mapping[str, Optional[bytes]]) -> Fold:
        """This fold with a delta's state entries applied (None deletes a key)."""
        records = dict(self.records)
        writes: dict[str, list[tuple[int, Optional[Element]]]] = {}
        for key, value in delta.items():
            if key.startswith(CHANNEL_PREFIX):
                channel = key[len(CHANNEL_PREFIX) :]
                if value is None:
                    records.pop(channel, None)
                else:
                    records[channel] = value
            elif key.startswith(ELEMENT_PREFIX):
                channel, _, index = key[len(ELEMENT_PREFIX) :].rpartition(":")
                if index.isdigit():
                    writes.setdefault(channel, []).append((int(index), None if value is None else Element(value)))
        elements = dict(self.elements)
        for channel, entries in writes.items():
            items = list(elements.get(channel, ()))
            for index, value in entries:
                if index >= len(items):
                    items.extend([None] * (index + 1 - len(items)))
                items[index] = value
            elements[channel] = items
        return Fold(records, elements)

    def record(self, channel: str) -> Optional[bytes]:
        """The channel's record: ``pack(version, kind, data)``."""
        return self.records.get(channel)

    def list_elements(self, channel: str, length: bytes) -> list[Element]:
        """The first ``length`` (ASCII decimal, from a ``continuum-list`` record) elements of a
        list channel. Raises ``CorruptionError`` if the length is malformed or an element is
        missing."""
        if not length.isdigit() or len(length) > LIST_LENGTH_DIGITS_MAX:
            raise continuum.CorruptionError(f"channel {channel!r}: list length {length[:32]!r} is not a number")
        count = int(length)
        items = self.elements.get(channel, [])[:count]
        if len(items) < count or None in items:
            raise continuum.CorruptionError(f"channel {channel!r}: the fold lacks elements of its {count}-element list")
        return items  # type: ignore[return-value]

    def stored_list(self, channel: str, codec: ElementCodec) -> Optional[StoredList]:
        """The channel's list as ``encode`` takes it for a base; None if it holds no list."""
        record = self.records.get(channel)
        if record is None:
            return None
        _, kind, data = unpack(record)
        if kind != LIST:
            return None
        elements = tuple(element.packed for element in self.list_elements(channel, data))
        keys = elements if codec.keys_are_stored else tuple(map(codec.key_of_stored, elements))
        return StoredList(elements, keys, (_UNKNOWN,) * len(elements))


EMPTY_FOLD = Fold({}, {})


class ListMemory:
    """The checkpoint each (run, namespace) was last put with (its atom and id) and its list
    channels, so that the next ``put`` finds its parent without a store call. Holds
    ``capacity`` entries, the least recently used dropped first; an entry names the atom it is
    true of, so a ``put`` with another parent does not use it. Atoms are never changed, and a
    run's id is never reused, so an entry never goes stale."""

    def __init__(self, capacity: int = 128) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[tuple[int, str], tuple[int, str, dict[str, StoredList]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run: int, agent: str, atom: int) -> Optional[dict[str, StoredList]]:
        """The list channels as of ``atom``, if they are the ones remembered."""
        entry = self.last(run, agent)
        return entry[2] if entry is not None and entry[0] == atom else None

    def last(self, run: int, agent: str) -> Optional[tuple[int, str, dict[str, StoredList]]]:
        """The remembered checkpoint: (atom, checkpoint id, list channels)."""
        with self._lock:
            entry = self._entries.get((run, agent))
            if entry is not None:
                self._entries.move_to_end((run, agent))
            return entry

    def set(self, run: int, agent: str, atom: int, checkpoint_id: str, lists: dict[str, StoredList]) -> None:
        """Remembers the list channels as of ``atom``, the checkpoint ``checkpoint_id``."""
        with self._lock:
            self._entries[(run, agent)] = (atom, checkpoint_id, lists)
            self._entries.move_to_end((run, agent))
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
