"""Strict JSON parsing, canonical JSON (RFC 8785, safe integers only) and
network-bound inputs.

Every signature, hash, AAD and KDF input in Meshline is the canonical JSON of
an object with the trusted network context added at its root as ``$context``.
The context comes from local configuration only; a transmitted object that
carries ``$context`` is refused (``WireContextForbidden``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import rfc8785

from gapline.meshline._base64 import b64u_encode
from gapline.meshline._errors import BadRequest, WireContextForbidden

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "NetworkContext",
    "canonical_json",
    "canonical_json_reference",
    "json_string",
    "local_input_bytes",
    "network_bound_bytes",
    "network_bound_hash",
    "parse_json",
    "sha256_text",
]

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 16

_CONTEXT_RE = re.compile(r"neo:(0|[1-9][0-9]{0,9}):0x[0-9a-f]{40}")
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")


class NetworkContext(str):
    """A validated ``neo:<magic>:0x<registry>`` string, taken from trusted config.

    No normalisation: anything but the exact canonical text is refused.
    """

    __slots__ = ()

    def __new__(cls, value: object) -> NetworkContext:
        if isinstance(value, NetworkContext):
            return value
        if not isinstance(value, str) or _CONTEXT_RE.fullmatch(value) is None:
            raise BadRequest(f"invalid network context: {value!r}")
        if int(value.split(":")[1]) > 0xFFFFFFFF:
            raise BadRequest("network magic out of range")
        return super().__new__(cls, value)

    @property
    def magic(self) -> int:
        return int(self.split(":")[1])


# The local-development network context: Neo magic 0 and the all-zero registry
# hash, format-valid (common-v1.json "zero_registry") and belonging to no
# deployed registry. `gapline relay serve` defaults to it, so a client and a
# local relay agree without configuration; it is never sent on the wire.
LOCAL_DEVELOPMENT_CONTEXT = NetworkContext("neo:0:0x" + "0" * 40)


def _reject_float(text: str) -> Any:
    raise BadRequest(f"protocol numbers are integers: {text}")


def _parse_int(text: str) -> int:
    if text == "-0" or _INT_RE.fullmatch(text) is None:
        raise BadRequest(f"non-canonical integer: {text}")
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        raise BadRequest(f"integer outside the safe range: {text}")
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise BadRequest("duplicate property name")
    return result


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"not JSON: {name}")


def _check_tree(value: Any) -> None:
    """Depth limit (root = 0) and Unicode scalar values, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(f"JSON nested deeper than {MAX_DEPTH}")
        if isinstance(node, str):
            _check_scalar_text(node)
        elif isinstance(node, dict):
            for key, child in node.items():
                _check_scalar_text(key)
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)


def _check_scalar_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("string holds a lone surrogate") from None


def parse_json(data: bytes | str) -> Any:
    """Parse protocol JSON strictly (general.md "JSON and field representations").

    Refuses duplicate names, depth over 16, ``-0``, fractions, exponents,
    integers beyond ±(2^53-1), NaN/Infinity, lone surrogates, invalid UTF-8
    and trailing data.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("invalid UTF-8") from None
    else:
        text = data
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("string holds a lone surrogate") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_parse_int,
            parse_float=_reject_float,
            parse_constant=_reject_constant,
        )
    except BadRequest:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None
    # The tree walk is only needed when it could find something. A node's depth
    # is at most the number of container openings in the text (strings included,
    # an over-count), and once the text itself is valid UTF-8 a lone surrogate can
    # only come from a \u escape. A typical request has ~7 brackets and no escape,
    # and skips a walk that cost the relay 15-50 µs per request.
    if "\\u" in text or text.count("{") + text.count("[") > MAX_DEPTH:
        _check_tree(value)
    return value


def _check_values(value: Any) -> None:
    """Only JSON types, string keys, safe integers: what RFC 8785 output may hold here."""
    t = type(value)
    if t is str or t is bool or value is None:
        return
    if t is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise BadRequest("integer outside the safe range")
    elif t is dict or isinstance(value, Mapping):
        for key, child in value.items():
            if type(key) is not str:
                raise BadRequest("object keys must be strings")
            if type(child) is not str:
                _check_values(child)
    elif t is list or t is tuple:
        for child in value:
            if type(child) is not str:
                _check_values(child)
    elif isinstance(value, float):
        raise BadRequest("protocol numbers are integers")
    elif isinstance(value, int):  # bool subclasses and int subclasses
        _check_values(int(value))
    else:
        raise BadRequest(f"not a JSON value: {type(value).__name__}")


# Characters at or above U+E000 are where Python's code-point key order can differ from
# RFC 8785's UTF-16 code-unit order (supplementary characters sort before U+E000..U+FFFF
# in UTF-16). Output holding none of them cannot have such a key.
_ORDER_SENSITIVE = re.compile("[\ue000-\U0010ffff]")
_encoder = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_dumps = _encoder.encode

#: The C string encoder ``_dumps`` applies to every ``str`` (``ensure_ascii=False``). The hot
#: fixed-shape inputs (message AAD, envelope signing input, key-box info) are assembled
#: from it with their keys written out in sorted order, skipping the generic walk; they use
#: it only for exact ``str``/``int`` values and all-ASCII output, so the bytes equal
#: ``network_bound_bytes`` of the same dict (tests/meshline/test_fastpaths.py).
json_string = json.encoder.encode_basestring

# ``JSONEncoder.encode`` builds this C encoder afresh on every call; built once, a call
# costs ~40 % less. No circular-reference markers: ``_check_values`` has already walked
# the value (a cycle fails there), which is all the markers would have caught.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_iterencode = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(None, _encoder.default, json_string, None, ":", ",", True, False, False)
)


def _encode(value: Any) -> str:
    if _iterencode is None:
        return _dumps(value)
    return "".join(_iterencode(value, 0))


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes, restricted to safe integers.

    The ``rfc8785`` package is the reference. For the protocol's value domain
    (strings, safe integers, booleans, null, arrays, objects) the stdlib
    encoder with sorted keys, no whitespace and raw UTF-8 emits the same bytes
    (same escapes: ``\\b \\f \\n \\r \\t \\" \\\\`` and lowercase ``\\u00xx``) at a third
    of the cost; any text where key order could differ goes through ``rfc8785``.
    tests/meshline/test_properties.py holds the two equal on generated values.
    """
    _check_values(value)
    text = _encode(value)
    if text.isascii():  # the usual case: no key-order question, no surrogates
        return text.encode("ascii")
    if _ORDER_SENSITIVE.search(text) is not None:
        return canonical_json_reference(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("string holds a lone surrogate") from None


def canonical_json_reference(value: Any) -> bytes:
    """Canonical JSON through the ``rfc8785`` package (the reference implementation)."""
    _check_values(value)
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        raise BadRequest(f"cannot canonicalise: {exc}") from None


def network_bound_bytes(
    obj: Mapping[str, Any], context: NetworkContext, *, exclude: Iterable[str] = ()
) -> bytes:
    """Canonical bytes of ``obj`` minus root ``exclude`` fields, plus root ``$context``."""
    if "$context" in obj:
        raise WireContextForbidden("a protocol object must not carry $context")
    bound = dict(obj)
    for name in exclude:
        bound.pop(name, None)
    bound["$context"] = str(context)
    return canonical_json(bound)


def sha256_text(data: bytes) -> str:
    """The spec's ``sha256:<base64url>`` digest text."""
    return "sha256:" + b64u_encode(hashlib.sha256(data).digest())


def network_bound_hash(
    obj: Mapping[str, Any], context: NetworkContext, *, exclude: Iterable[str] = ()
) -> str:
    return sha256_text(network_bound_bytes(obj, context, exclude=exclude))


def local_input_bytes(obj: Mapping[str, Any], context: NetworkContext) -> bytes:
    """Canonical bytes of a *locally built* input that may already name its context.

    A ``$context`` already present must equal the trusted one; otherwise it is added.
    """
    if "$context" in obj:
        if obj["$context"] != str(context):
            raise BadRequest("local input names another network context")
        return canonical_json(obj)
    return canonical_json({**obj, "$context": str(context)})
