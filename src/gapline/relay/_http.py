"""The HTTPS transport: method dots become path slashes under the base path.

GET carries parameters as query fields (typed from the method's field table,
shortest-decimal integers, no repeats, unknown names ignored); PUT and POST carry
the whole parameter object as a JSON body. Failures are ``RelayError`` bodies with
the spec's status map; ``rate_limited`` adds ``Retry-After``.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gapline.meshline import MAX_SAFE_INTEGER, MeshlineError, parse_json
from gapline.relay._errors import RelayFailure, http_status
from gapline.relay._methods import Call, SessionMode, token_hash
from gapline.relay._rpc import invoke

if TYPE_CHECKING:
    from gapline.relay._server import RelayServer

__all__ = ["SESSION_HEADER", "http_handler"]

SESSION_HEADER = "X-Meshline-Session"
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,256}")


def _json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def failure_response(exc: RelayFailure) -> web.Response:
    headers = None
    if exc.code == "rate_limited" and exc.data and "retry_after" in exc.data:
        headers = {"Retry-After": str(exc.data["retry_after"])}
    return _json_response(exc.to_relay_error(), http_status(exc.code), headers)


def _query_params(request: web.Request, fields: dict[str, str] | Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, kind in fields.items():
        values = request.query.getall(name, [])
        if not values:
            continue
        if len(values) > 1:
            raise RelayFailure("bad_request", f"{name}: query field repeated")
        text = values[0]
        if kind == "int":
            if _INT_RE.fullmatch(text) is None or text == "-0":
                raise RelayFailure("bad_request", f"{name}: not a shortest-form decimal integer")
            value = int(text)
            if abs(value) > MAX_SAFE_INTEGER:
                raise RelayFailure("bad_request", f"{name}: outside the safe integer range")
            params[name] = value
        else:
            params[name] = text
    return params


async def _body_params(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise RelayFailure("request_too_large", f"request body exceeds {limit} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RelayFailure("request_too_large", f"request body exceeds {limit} bytes") from None
    if not raw:
        return {}
    if request.content_type.lower() != "application/json":
        raise RelayFailure("bad_request", "Content-Type must be application/json")
    charset = request.charset
    if charset is not None and charset.lower() != "utf-8":
        raise RelayFailure("bad_request", "charset, when given, must be utf-8")
    try:
        value = parse_json(raw)
    except MeshlineError as exc:
        raise RelayFailure("bad_request", exc.message) from None
    if not isinstance(value, dict):
        raise RelayFailure("bad_request", "the request body must be a JSON object")
    return value


def http_handler(server: RelayServer):
    relay = server.relay
    limit = server.config.max_request_bytes

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["path"].replace("/", ".")
        method = relay.methods.get(name)
        if method is None:
            return failure_response(RelayFailure("method_not_found", f"no method {name!r}"))
        verb = request.method
        allowed = {method.http_verb}
        if method.name == "device.state.resolve":
            allowed.add("POST")
        if verb not in allowed:
            return failure_response(
                RelayFailure("bad_request", f"{name} is called with {method.http_verb}")
            )
        try:
            token = request.headers.get(SESSION_HEADER)
            digest = token_hash(token) if token is not None else None
            wait = server.limiter.take(digest or f"addr:{request.remote}")
            if wait:
                server.metrics.rate_limited.inc()
                raise RelayFailure("rate_limited", "too many requests", {"retry_after": wait})
            if verb == "GET":
                params = _query_params(request, method.query)
            else:
                params = await _body_params(request, limit)
            call = Call(extra={"http_verb": verb})
            if method.session is not SessionMode.NONE:
                if token is None or _TOKEN_RE.fullmatch(token) is None or digest is None:
                    raise RelayFailure("unauthorized", "missing or malformed session token")
                call.session = await server.session(digest)
                if call.session is None:
                    raise RelayFailure("unauthorized", "session absent, expired or revoked")
            result = await invoke(method, call, params, server.metrics, "http")
        except RelayFailure as exc:
            return failure_response(exc)
        if method.no_content or result is None:
            return web.Response(status=204)
        return _json_response(result)

    return handle
