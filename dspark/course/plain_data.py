"""What crosses the pipes between the grader and a check's process: a `Call` in, a reply out.

A request is a `Call` (the student's function's name, its arguments, the `Probe`s among them),
pickled by the grader: the check's process trusts the grader. A reply goes the other way and
must not be trusted: it is plain data only -- numbers, strings, lists, tuples, dicts, and
tensors as (dtype, shape, bytes) -- made so by `to_plain` in the check's process and read back
by `decode_reply` with an unpickler that loads no class at all, so nothing the student's code
sends can run code in the grader; a value that is not plain data arrives as `NotPlainData`
(its type's name), a damaged one as `BadReply`. Every message on a pipe is its length
(`HEADER`, 8 bytes) and then its bytes.

What this file does not do: open, read or write a pipe (dspark/course/sandbox.py in the check's
process, dspark/course/check_process.py in the grader) or judge a value (the checks do).
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_DEPTH = 32  # nesting of a reply's lists, tuples and dicts
NOT_PLAIN = "__dspark_not_plain_data__"  # marks a value that was not plain data, in a reply
HEADER = struct.Struct(">Q")  # every message: its length, then its bytes


class BadReply(Exception):
    """The check's process sent something that is not a reply; the message says what."""


@dataclass(frozen=True)
class NotPlainData:
    """Stands for a value the student's code returned that is not plain data (its type's name)."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


class Probe:
    """A test double handed to the student's code that records what it saw. After a call, the
    check's process sends `grading_log()` (plain data) and the grader feeds it to the grader's
    own copy with `absorb_grading_log`, which judges it there."""

    def grading_log(self) -> Any:
        raise NotImplementedError

    def absorb_grading_log(self, log: Any) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Call:
    """One request: call the student's function `name(*args, **kwargs)`; send back its value, the
    arguments after the call if `return_arguments`, and each probe's log."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    probes: tuple[Probe, ...] = ()
    return_arguments: bool = False


# ---- plain data ---------------------------------------------------------------------------------------
TENSOR = "__dspark_tensor__"  # marks a tensor in a reply: (dtype name, shape, bytes)
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16)
    + (torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
}


def to_plain(value: Any, depth: int = 0) -> Any:
    """`value` as plain data (in the check's process): tensors as (dtype, shape, bytes), containers
    rebuilt, numpy scalars as Python numbers, anything else as a marker naming its type."""
    if depth > MAX_DEPTH:
        return {NOT_PLAIN: "too deeply nested value"}
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return value
    if isinstance(value, torch.Tensor):
        return _tensor_to_plain(value)
    for kind in (bool, int, float, str):  # subclasses (IntEnum, ...) as the base type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (list, tuple)):
        items = [to_plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_plain_key(k): to_plain(v, depth + 1) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return to_plain(value.item(), depth + 1)
    return {NOT_PLAIN: type(value).__name__}


def _tensor_to_plain(value: torch.Tensor) -> dict:
    tensor = value.detach().cpu()
    tensor = tensor.to_dense() if tensor.layout != torch.strided else tensor
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        return {NOT_PLAIN: f"tensor of dtype {name}"}
    tensor = tensor.resolve_conj().resolve_neg().as_subclass(torch.Tensor).contiguous().clone()
    return {TENSOR: (name, tuple(tensor.shape), bytes(tensor.untyped_storage()))}


def _plain_key(key: Any) -> Any:
    return key if key is None or type(key) in (bool, int, float, str) else f"<{type(key).__name__}>"


def from_plain(value: Any, depth: int = 0) -> Any:
    """A decoded reply with its markers turned back into tensors and `NotPlainData` (in the grader)."""
    if depth > MAX_DEPTH:
        raise BadReply("the reply is nested too deeply")
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(NOT_PLAIN), str):
            return NotPlainData(value[NOT_PLAIN])
        if len(value) == 1 and TENSOR in value:
            return _tensor_from_plain(value[TENSOR])
        return {k: from_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(from_plain(v, depth + 1) for v in value)
    return value


def _tensor_from_plain(spec: Any) -> torch.Tensor:
    """The tensor of a (dtype name, shape, bytes) triple, checked to fit together."""
    if not (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], bytes)):
        raise BadReply("the check's process sent back a damaged tensor")
    name, shape, data = spec
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None or not isinstance(shape, tuple) or len(shape) > MAX_DEPTH:
        raise BadReply("the check's process sent back a damaged tensor")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise BadReply("the check's process sent back a damaged tensor")
    if math.prod(shape) * torch.empty((), dtype=dtype).element_size() != len(data):
        raise BadReply("the check's process sent back a damaged tensor")
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _PlainUnpickler(pickle.Unpickler):
    """Loads lists, tuples, dicts, strings, bytes and numbers: no class and no function at all
    (complex numbers aside), so unpickling a reply cannot run anything."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a reply has no persistent ids")


def encode_reply(reply: dict) -> bytes:
    """A reply (plain data only: `to_plain` made it so) as bytes."""
    return pickle.dumps(reply, protocol=5)


def decode_reply(data: bytes) -> dict:
    """The reply in `data`, read as plain data only (BadReply otherwise)."""
    try:
        reply = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - whatever the bytes are, they are not a reply
        what = type(exc).__name__
        raise BadReply(f"the check's process sent back garbage ({what})") from None
    reply = from_plain(reply)
    if not isinstance(reply, dict) or reply.get("kind") not in ("returned", "raised", "missing", "hello"):
        raise BadReply("the check's process sent back something that is not a reply")
    return reply
