"""HTTPS transport (methods/conventions.md): one request per method call.

Path = base + method name with dots as slashes; GET params go in the query
string (integers in shortest decimal, booleans ``true``/``false``, no nested
values); other verbs send the whole params object as a JSON body. The session
token rides in ``X-Meshline-Session`` and never leaves the base URL's origin.
Failures are ``RelayError``s built from the relay's ``RelayError`` body; a
body that is not one is a ``TransportError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from gapline.meshline._canonical import canonical_json, parse_json
from gapline.meshline._errors import BadRequest, MeshlineError, TransportError, error_from_code

__all__ = ["HTTP_METHODS", "SESSION_HEADER", "SIGNED_POST_FORMS", "HttpTransport", "encode_query"]

SESSION_HEADER = "X-Meshline-Session"

#: HTTP verb of every base-module method (client-relay/README.md).
HTTP_METHODS: Mapping[str, str] = {
    "relay.descriptor": "GET",
    "relay.info": "GET",
    "auth.challenge": "POST",
    "auth.device.verify": "POST",
    "auth.account.verify": "POST",
    "device.state.publish": "PUT",
    "device.state.resolve": "GET",
    "profile.publish": "PUT",
    "profile.resolve": "GET",
    "account.route.publish": "PUT",
    "account.route.resolve": "GET",
    "message.send": "POST",
    "message.delivery.status": "GET",
    "message.timeline.sync": "GET",
}


#: Queries whose signed form (params carrying ``$type``) is a POST: a signature and nested
#: authorization material never ride in a query string (methods/conventions.md).
SIGNED_POST_FORMS = frozenset({"device.state.resolve"})


def encode_query(params: Mapping[str, Any] | None) -> dict[str, str]:
    """GET parameters as query strings; arrays, objects and null are not representable."""
    query: dict[str, str] = {}
    for name, value in (params or {}).items():
        if isinstance(value, bool):
            query[name] = "true" if value else "false"
        elif isinstance(value, int):
            query[name] = str(value)
        elif isinstance(value, str):
            query[name] = value
        else:
            raise BadRequest(f"GET parameter {name!r} must be a string, integer or boolean")
    return query


class HttpTransport:
    """Calls relay methods over HTTP(S). ``base_url`` ends with the base path (``/meshline/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
    ):
        self._base = base_url.rstrip("/")
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)

    @property
    def base_url(self) -> str:
        return self._base

    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, session: str | None = None
    ) -> Any:
        verb = HTTP_METHODS.get(method, "POST")
        if verb == "GET" and method in SIGNED_POST_FORMS and params and "$type" in params:
            verb = "POST"
        url = self._base + "/" + method.replace(".", "/")
        headers = {"Accept": "application/json"}
        if session is not None:
            headers[SESSION_HEADER] = session
        try:
            if verb == "GET":
                response = await self._client.request(
                    verb, url, params=encode_query(params), headers=headers
                )
            else:
                body = None if params is None else canonical_json(dict(params))
                if body is not None:
                    headers["Content-Type"] = "application/json"
                response = await self._client.request(verb, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"{method}: {type(exc).__name__}: {exc}") from exc
        return _result(method, response)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _result(method: str, response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    content_type = response.headers.get("content-type", "")
    try:
        body = (
            parse_json(response.content)
            if content_type.lower().startswith("application/json")
            else None
        )
    except MeshlineError:
        body = None
    if response.status_code == 200 and body is not None:
        return body
    if (
        response.status_code >= 400
        and isinstance(body, dict)
        and isinstance(body.get("code"), str)
        and isinstance(body.get("message"), str)
    ):
        data = body.get("data")
        raise error_from_code(
            body["code"], body["message"], data if isinstance(data, dict) else None
        )
    raise TransportError(f"{method}: unexpected HTTP {response.status_code} response")
