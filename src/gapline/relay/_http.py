"""The HTTPS transport: method dots become path slashes under the base path.

GET carries parameters as query fields (typed from the method's field table,
shortest-decimal integers, no repeats, unknown names ignored); PUT and POST carry
the whole parameter object as a JSON body. Failures are ``RelayError`` bodies with
the spec's status map; ``rate_limited`` adds ``Retry-After``. Every parse is bounded
(:mod:`gapline.relay._bounds`), a body must arrive within ``body_timeout``, and a
client that goes away mid-body is one debug log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, NoReturn

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gapline.relay._bounds import address_key, parse_params, query_params, session_token
from gapline.relay._errors import RelayFailure, http_status
from gapline.relay._methods import Call, SessionMode, token_hash
from gapline.relay._rpc import invoke, unexpected

if TYPE_CHECKING:
    from gapline.relay._server import RelayServer

__all__ = ["SESSION_HEADER", "failure_response", "http_handler", "refuse"]

log = logging.getLogger("gapline.relay")

SESSION_HEADER = "X-Meshline-Session"


class _ClientGone(Exception):
    """The client closed its connection before its request was read."""


class _BodyTimeout(Exception):
    """The body did not arrive within ``body_timeout``."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"request body not received within {timeout:g} s")
        self.timeout = timeout


def _json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    # "replace": a message may quote client input holding a lone surrogate (a header
    # byte aiohttp decoded with surrogateescape); the answer must still be UTF-8.
    return web.Response(
        body=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace"),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def failure_response(exc: RelayFailure) -> web.Response:
    headers = None
    if exc.code == "rate_limited" and exc.data and "retry_after" in exc.data:
        headers = {"Retry-After": str(exc.data["retry_after"])}
    return _json_response(exc.to_relay_error(), http_status(exc.code), headers)


async def _read_body(request: web.Request, limit: int, seconds: float) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise RelayFailure("request_too_large", f"request body exceeds {limit} bytes")
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RelayFailure("request_too_large", f"request body exceeds {limit} bytes") from None
    except TimeoutError:
        raise _BodyTimeout(seconds) from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise _ClientGone(str(exc) or type(exc).__name__) from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        # Broken framing (chunk sizes, a short Content-Length body at EOF).
        raise RelayFailure("bad_request", f"malformed request body: {exc}"[:300]) from None


async def _body_params(request: web.Request, limit: int, seconds: float) -> dict[str, Any]:
    raw = await _read_body(request, limit, seconds)
    if not raw:
        return {}
    if request.content_type.lower() != "application/json":
        raise RelayFailure("bad_request", "Content-Type must be application/json")
    charset = request.charset
    if charset is not None and charset.lower() != "utf-8":
        raise RelayFailure("bad_request", "charset, when given, must be utf-8")
    value = parse_params(raw)
    if not isinstance(value, dict):
        raise RelayFailure("bad_request", "the request body must be a JSON object")
    return value


async def refuse(server: RelayServer, payer: str, wait: int) -> NoReturn:
    """``rate_limited``, held first when ``payer`` keeps ignoring Retry-After."""
    server.metrics.rate_limited.inc()
    delay = server.admission.hold(payer, wait)
    if delay:
        server.metrics.refusals_held.inc()
        await asyncio.sleep(delay)
    raise RelayFailure("rate_limited", "too many requests", {"retry_after": wait})


def http_handler(server: RelayServer):
    relay = server.relay
    config = server.config
    limit = config.max_request_bytes
    metrics = server.metrics

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["path"].replace("/", ".")
        method = relay.methods.get(name)
        if method is None:
            return failure_response(RelayFailure("method_not_found", f"no method {name[:100]!r}"))
        verb = request.method
        allowed = {method.http_verb}
        if method.name == "device.state.resolve":
            allowed.add("POST")
        if verb not in allowed:
            return failure_response(
                RelayFailure("bad_request", f"{name} is called with {method.http_verb}")
            )
        address = address_key(request.remote)
        admission = server.admission
        session = None
        try:
            token = session_token(request.headers.get(SESSION_HEADER))
            digest = token_hash(token) if token is not None else None
            # Charged to the session only once the relay knows it (see Admission).
            session = server.cached_session(digest) if digest is not None else None
            if session is not None:
                assert digest is not None
                payer = digest
                wait = admission.charge_verified(digest, session.account)
            else:
                payer = address
                wait = admission.charge_unverified(address)
            if wait:
                await refuse(server, payer, wait)
            if verb == "GET":
                params = query_params(request.query, method.query)
            else:
                params = await _body_params(request, limit, config.body_timeout)
            call = Call(extra={"http_verb": verb})
            if method.session is not SessionMode.NONE:
                if digest is None:
                    raise RelayFailure("unauthorized", "missing or malformed session token")
                if session is None:
                    # A store lookup, already paid for by the address above.
                    session = await server.session(digest)
                    if session is None:
                        raise RelayFailure("unauthorized", "session absent, expired or revoked")
                    wait = admission.charge_verified(digest, session.account)
                    if wait:
                        await refuse(server, digest, wait)
                call.session = session
            result = await invoke(
                method,
                call,
                params,
                metrics,
                "http",
                quota=server.challenges,
                address=address,
            )
        except RelayFailure as exc:
            if session is None and exc.code != "rate_limited":
                admission.failed_unverified(address)
            return failure_response(exc)
        except _ClientGone as exc:
            metrics.client_disconnects.inc()
            log.debug(
                "client disconnected mid-body",
                extra={"remote": address, "method": name, "reason": str(exc)},
            )
            admission.failed_unverified(address)
            response = failure_response(RelayFailure("bad_request", "request body incomplete"))
            response.force_close()
            return response
        except _BodyTimeout as exc:
            metrics.timeouts.labels("body").inc()
            admission.failed_unverified(address)
            log.debug(
                "request body not received in time; closing",
                extra={"remote": address, "method": name, "timeout": exc.timeout},
            )
            response = failure_response(RelayFailure("bad_request", str(exc)))
            response.force_close()
            return response
        except Exception:  # noqa: BLE001 - logged with an error id by unexpected()
            return failure_response(unexpected(metrics, "http", name))
        if method.no_content or result is None:
            return web.Response(status=204)
        return _json_response(result)

    return handle
