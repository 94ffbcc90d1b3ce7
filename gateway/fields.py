"""Field readers for JSON request bodies: each names the exact field and the fix when it refuses.

All raise `ApiError("invalid_request", ...)`; messages read like `samples[3].input_ids[7] = -1 must
be an integer between 0 and 151935`.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ApiError

MISSING: Any = object()


def invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


def require_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be a JSON object, got {json_type(value)}")
    return value


def reject_unknown(body: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise invalid(
            f"unknown field(s) {', '.join(repr(k) for k in unknown)} in {where}; "
            f"known fields: {', '.join(known)}"
        )


def get_int(body: dict[str, Any], name: str, low: int, high: int, default: Any = MISSING,
            where: str = "") -> Any:
    """An integer in [low, high]; booleans and floats are refused."""
    value = body.get(name, MISSING)
    if value is MISSING or value is None:
        if default is MISSING:
            raise invalid(f"missing required field {where}{name}")
        return default
    if type(value) is not int or not low <= value <= high:
        raise invalid(f"{where}{name} = {short(value)} must be an integer between {low} and {high}")
    return value


def get_bounded(body: dict[str, Any], name: str, bound: int, default: Any, what: str) -> Any:
    """A positive integer up to a compiled bound: 400 below 1, 413 (too_large) above the bound."""
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not int or value < 1:
        raise invalid(f"{name} = {short(value)} must be a positive integer")
    if value > bound:
        raise ApiError("too_large", f"{name} = {value} is over the compiled bound of {bound} {what}")
    return value


def get_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} = {short(value)} must be true or false")
    return value


def get_str(body: dict[str, Any], name: str, default: Any = MISSING, max_len: int = 1 << 20) -> Any:
    value = body.get(name, MISSING)
    if value is MISSING or value is None:
        if default is MISSING:
            raise invalid(f"missing required field {name}")
        return default
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string, got {json_type(value)}")
    if len(value) > max_len:
        raise invalid(f"{name} is {len(value)} characters long; at most {max_len} are allowed")
    return value


def get_choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if value not in choices:
        raise invalid(f"{name} = {short(value)} must be one of {', '.join(choices)}")
    return value


def token_ids(value: Any, where: str, vocab_size: int, allow_empty: bool = False) -> list[int]:
    """A list of token ids, each an integer in [0, vocab_size)."""
    if not isinstance(value, list):
        raise invalid(f"{where} must be a list of token ids, got {json_type(value)}")
    if not value and not allow_empty:
        raise invalid(f"{where} must hold at least one token id")
    if set(map(type, value)) <= {int} and (not value or (min(value) >= 0 and max(value) < vocab_size)):
        return value  # the common case, checked at C speed
    for i, t in enumerate(value):
        if type(t) is not int or not 0 <= t < vocab_size:
            raise invalid(f"{where}[{i}] = {short(t)} must be an integer token id between 0 and {vocab_size - 1}")
    raise AssertionError("unreachable")


def string_list(value: Any, where: str, max_items: int) -> list[str]:
    if not isinstance(value, list) or not value:
        raise invalid(f"{where} must be a non-empty list of strings, got {short(value)}")
    if len(value) > max_items:
        raise ApiError("too_large", f"{where} holds {len(value)} entries; at most {max_items} are compiled")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise invalid(f"{where}[{i}] must be a string, got {json_type(item)}")
    return value


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
