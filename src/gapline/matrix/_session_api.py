"""Sans-I/O builders and answers for what a login offers and what it leaves behind.

``GET /login`` says which login types a homeserver accepts (a homeserver behind single
sign-on offers no ``m.login.password``: a client that only has a password must say so
before asking for one); ``GET /devices`` lists the account's devices (a logout deletes
its own). The password login and ``POST /logout`` themselves are in `_api`.
"""

from __future__ import annotations

import msgspec

from ._request import CLIENT_V3, Request, _path

__all__ = [
    "PASSWORD_LOGIN",
    "SSO_LOGIN",
    "Device",
    "DevicesResponse",
    "LoginFlow",
    "LoginFlowsResponse",
    "devices",
    "login_flows",
]

PASSWORD_LOGIN = "m.login.password"
SSO_LOGIN = "m.login.sso"


def login_flows() -> Request:
    """``GET /login``: the login types the homeserver accepts (unauthenticated)."""
    return Request("GET", _path(CLIENT_V3, "login"), authenticated=False)


def devices() -> Request:
    """``GET /devices``: every device of the logged-in account."""
    return Request("GET", _path(CLIENT_V3, "devices"))


class LoginFlow(msgspec.Struct, frozen=True, kw_only=True):
    type: str


class LoginFlowsResponse(msgspec.Struct, frozen=True, kw_only=True):
    flows: tuple[LoginFlow, ...] = ()

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(flow.type for flow in self.flows)

    @property
    def password(self) -> bool:
        """Whether a password login is offered at all."""
        return PASSWORD_LOGIN in self.types

    @property
    def sso_only(self) -> bool:
        """Single sign-on offered, a password not: the person must log in in a browser."""
        return not self.password and SSO_LOGIN in self.types


class Device(msgspec.Struct, frozen=True, kw_only=True):
    device_id: str
    display_name: str | None = None
    last_seen_ts: int | None = None


class DevicesResponse(msgspec.Struct, frozen=True, kw_only=True):
    devices: tuple[Device, ...] = ()

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(device.device_id for device in self.devices)
