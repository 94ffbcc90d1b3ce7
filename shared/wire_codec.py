"""Generic, bounded msgpack codec for frozen dataclasses, used by shared/protocol.py.

A dataclass travels as a msgpack array of its fields in declaration order (no field names on the
wire: the protocol version in the handshake pins the layout). Decoding builds one small checker per
field type once, from the type hints, and type-checks every value of untrusted input; a bad value
raises FieldError with the path to it (e.g. `.requests[3].sample_lens`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

Decoder = Callable[[Any], Any]


class FieldError(Exception):
    """A value of the wrong type or shape; `path` locates it inside the message."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path, self.problem = path, problem


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_wire(obj: Any) -> Any:
    """msgpack `default` hook: dataclasses become arrays of their fields; numpy scalars plain."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if isinstance(obj, np.generic):
            return obj.item()
        if not dataclasses.is_dataclass(obj):
            raise TypeError(f"cannot encode {cls.__name__} in a protocol message")
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return [getattr(obj, name) for name in names]


def record_decoder(cls: type) -> Decoder:
    """Decoder of `cls` from a tuple of its fields (msgpack unpacked with use_list=False)."""
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    decoders = tuple(decoder_for(hints[name]) for name in names)

    def dec(value: Any) -> Any:
        if not isinstance(value, tuple) or len(value) != len(names):
            got = f"{len(value)} fields" if isinstance(value, tuple) else type(value).__name__
            raise FieldError("", f"expected {cls.__name__} as {len(names)} fields, got {got}")
        try:
            args = [d(v) for d, v in zip(decoders, value)]
        except FieldError:  # decode again, field by field, only to name the path of the bad value
            for name, d, v in zip(names, decoders, value):
                at("." + name, d, v)
            raise
        try:
            return cls(*args)
        except (TypeError, ValueError) as exc:
            raise FieldError("", str(exc)) from None
    return dec


def at(step: str, dec: Decoder, value: Any) -> Any:
    """dec(value), prefixing `step` to the path of any FieldError."""
    try:
        return dec(value)
    except FieldError as exc:
        raise FieldError(step + exc.path, exc.problem) from None


_SCALARS = {int: "an integer", float: "a number", str: "a string", bytes: "bytes", bool: "a boolean"}


def decoder_for(hint: Any) -> Decoder:
    """Decoder for one field type: scalars, X | None, tuple[X, ...], dict[str, X], dataclasses."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        return _float
    if hint in _SCALARS:
        return _scalar((hint,), _SCALARS[hint])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) < len(args) and len(inner) == 1:
            return _optional(decoder_for(inner[0]))
        if all(a in _SCALARS for a in inner):
            return _scalar(tuple(inner), " or ".join(_SCALARS[a] for a in inner))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _sequence(decoder_for(args[0]), args[0])
    if origin is dict and args[0] is str:
        return _mapping(decoder_for(args[1]))
    if dataclasses.is_dataclass(hint):
        return record_decoder(hint)
    raise TypeError(f"protocol field type {hint!r} has no decoder")


def _scalar(kinds: tuple[type, ...], label: str) -> Decoder:
    def dec(value: Any) -> Any:
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise FieldError("", f"expected {label}, got {type(value).__name__}")
        return value
    return dec


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError("", f"expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise FieldError("", "expected a finite number")
    return value


def _optional(inner: Decoder) -> Decoder:
    return lambda value: None if value is None else inner(value)


def _sequence(inner: Decoder, item_type: Any) -> Decoder:
    # Fast path for arrays of plain ints/strs (sample lengths, label ids): exact type check only.
    exact = item_type if item_type in (int, str, bytes) else None

    def dec(value: Any) -> tuple:
        if not isinstance(value, tuple):
            raise FieldError("", f"expected an array, got {type(value).__name__}")
        if exact is not None and all(type(item) is exact for item in value):
            return value
        try:
            return tuple([inner(item) for item in value])
        except FieldError:
            for i, item in enumerate(value):
                at(f"[{i}]", inner, item)
            raise
    return dec


def _mapping(inner: Decoder) -> Decoder:
    def dec(value: Any) -> dict:
        if not isinstance(value, dict):
            raise FieldError("", f"expected a map, got {type(value).__name__}")
        if not all(isinstance(k, str) for k in value):
            raise FieldError("", "map keys must be strings")
        return {k: at(f"[{k!r}]", inner, v) for k, v in value.items()}
    return dec
