"""Protobuf's wire format read with numpy: every field of many messages at once.

``scan`` walks the messages of one buffer side by side, a field of each per step, so the cost is
a few numpy operations per step (as many steps as the longest message has fields), never a
Python object per message or field. The caller then picks fields by number (``Fields.one``,
``Fields.every``) and checks their wire types; anything malformed reads as None, and the caller
falls back to protobuf's own parser, which says what is wrong.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

__all__ = [
    "FIXED32",
    "FIXED64",
    "LENGTH",
    "PADDING",
    "VARINT",
    "Fields",
    "data_buffer",
    "gather",
    "scan",
    "strings",
    "varints",
]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
#: Bytes past the end of the data that varint reads may touch (a varint has at most 10).
PADDING = 16


class Fields(NamedTuple):
    """Every field of the messages scanned, the first field of every message, then the second
    ...: the message it is in, its number and wire type, where its value starts and its size
    in bytes (a varint's value in ``value``)."""

    message: np.ndarray
    number: np.ndarray
    wire: np.ndarray
    at: np.ndarray
    size: np.ndarray
    value: np.ndarray

    def every(self, number: int, wire: int) -> np.ndarray | None:
        """The positions (into these arrays) of field ``number``, in message order (a message's
        own in wire order); None where one has another wire type."""
        picked = np.flatnonzero(self.number == number)
        if (self.wire[picked] != wire).any():
            return None
        return picked[np.argsort(self.message[picked], kind="stable")]

    def one(self, number: int, wire: int, messages: int) -> np.ndarray | None:
        """For each of the ``messages``, the position of its field ``number`` (-1 where absent);
        None where one has it twice or with another wire type."""
        picked = self.every(number, wire)
        if picked is None:
            return None
        which = np.full(messages, -1, np.int64)
        owner = self.message[picked]
        which[owner] = picked
        if len(owner) and (np.diff(owner) <= 0).any():  # message order: a repeat is not > 0
            return None
        return which

    def varints(self, number: int, messages: int) -> np.ndarray | None:
        """Field ``number`` of each message as a varint (0 where absent, as protobuf's
        default); None where a message has it twice or otherwise encoded."""
        which = self.one(number, VARINT, messages)
        if which is None:
            return None
        values = np.zeros(messages, np.uint64)
        present = which >= 0
        values[present] = self.value[which[present]]
        return values


def data_buffer(chunks: list[bytes]) -> tuple[pa.Buffer, np.ndarray, np.ndarray, np.ndarray]:
    """``chunks`` as one padded buffer (as arrow's and numpy's views) and each one's start and
    end in it."""
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    data = pa.py_buffer(b"".join(chunks) + bytes(PADDING))
    ends = np.cumsum(lengths)
    return data, np.frombuffer(data, np.uint8), ends - lengths, ends


def scan(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Fields | None:
    """The fields of the messages ``buf[starts[i]:ends[i]]`` (``buf`` padded by ``PADDING``);
    None where one is malformed (a group, a bad wire type, a field past its message's end)."""
    which = np.flatnonzero(starts < ends)
    cursor = starts[which]
    steps: list[tuple[np.ndarray, ...]] = []
    while len(which):
        tag, tag_size = varints(buf, cursor)
        wire = (tag & np.uint64(7)).astype(np.int64)
        at = cursor + tag_size
        value = np.zeros(len(which), np.uint64)
        size = np.where(wire == FIXED64, 8, np.where(wire == FIXED32, 4, 0))
        if not np.isin(wire, (VARINT, FIXED64, LENGTH, FIXED32)).all():
            return None
        numeric = np.flatnonzero(wire == VARINT)
        if len(numeric):
            value[numeric], used = varints(buf, at[numeric])
            size[numeric] = used  # the varint's own bytes: skipped like a value's
        delimited = np.flatnonzero(wire == LENGTH)
        if len(delimited):
            length, used = varints(buf, at[delimited])
            at[delimited] += used
            size[delimited] = np.minimum(length, np.uint64(1 << 40)).astype(np.int64)
        cursor = at + size
        end = ends[which]
        if (cursor > end).any():
            return None
        steps.append((which, (tag >> np.uint64(3)).astype(np.int64), wire, at, size, value))
        going = cursor < end
        which, cursor = which[going], cursor[going]
    if not steps:
        empty = np.empty(0, np.int64)
        return Fields(empty, empty, empty, empty, empty, np.empty(0, np.uint64))
    return Fields(*(np.concatenate(column) for column in zip(*steps, strict=True)))


def varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The base-128 varints at ``at`` (up to 10 bytes each, as uint64) and their sizes in
    bytes; a varint longer than 10 bytes reads as one that ends at the tenth (a later check
    then fails)."""
    byte = buf[at]
    value = (byte & 0x7F).astype(np.uint64)
    size = np.ones(len(at), np.int64)
    going = byte >= 0x80
    for shift in range(1, 10):
        if not going.any():  # most are one byte: one pass
            break
        more = np.flatnonzero(going)
        byte = buf[at[more] + shift]
        value[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * shift)
        size[more] += 1
        going[more] = byte >= 0x80
    return value, size


def gather(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at each of ``at``, one row each."""
    return np.lib.stride_tricks.sliding_window_view(buf, width)[at]


def strings(data: pa.Buffer, at: np.ndarray, length: np.ndarray) -> pa.Array | None:
    """The UTF-8 strings of ``length`` bytes at ``at`` in ``data`` (in order, apart), as one
    arrow array; None where one is not UTF-8 (protobuf's own parse then says why). No copy of
    the bytes: an array whose every other item is a string and the rest the gaps between them."""
    bounds = np.empty(2 * len(at) + 1, np.int64)
    bounds[0:-1:2] = at
    bounds[1::2] = at + length
    bounds[-1] = bounds[-2] if len(at) else 0
    if bounds[-1] > np.iinfo(np.int32).max:
        return None
    spaced = pa.Array.from_buffers(
        pa.binary(), 2 * len(at), [None, pa.py_buffer(bounds.astype(np.int32)), data]
    )
    try:
        return spaced.take(pa.array(np.arange(0, 2 * len(at), 2))).cast(pa.string())
    except pa.ArrowInvalid:
        return None
