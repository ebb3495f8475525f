"""Matrix client-server access: pure request builders, typed responses, one async client.

Layers (sans-I/O, after matrix-nio and httpx):

- `gapline.matrix.api`: pure functions returning a `Request` (no I/O);
- typed, frozen response structs (`SyncResponse`, `MessagesResponse`, ...);
- `MatrixClient`: the async client whose single ``_send`` owns auth, retries
  and timeouts, raising the `MatrixError` tree;
- `gapline.matrix.testing`: an in-memory fake homeserver behind
  ``httpx.MockTransport`` with fault knobs;
- `gapline.matrix.devserver`: a throwaway real Synapse for tests and demos.
"""

from . import _api as api
from . import _api_crypto as crypto_api
from ._api_crypto import (
    BackupVersionResponse,
    KeyBackupData,
    RoomKeysResponse,
    RoomKeysRoomResponse,
    RoomKeysUpdateResponse,
    SignaturesUploadResponse,
)
from ._client import MatrixClient, RetryPolicy, Session
from ._errors import (
    Forbidden,
    MatrixError,
    MatrixHTTPError,
    MatrixProtocolError,
    MatrixUnavailable,
    NotFound,
    RateLimited,
    UnknownToken,
)
from ._request import Direction, Request
from ._responses import (
    BasicEvent,
    ClientEvent,
    ContextResponse,
    DeviceLists,
    EmptyResponse,
    EventBlock,
    InvitedRoom,
    JoinedRoom,
    KeysChangesResponse,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    LeftRoom,
    LoginResponse,
    MessagesResponse,
    RelationsResponse,
    RoomMember,
    Rooms,
    SendResponse,
    StateBlock,
    StrippedStateEvent,
    SyncResponse,
    Timeline,
    ToDevice,
    ToDeviceEvent,
    UploadResponse,
    WhoAmIResponse,
    parse,
)
from ._session_api import Device, DevicesResponse, LoginFlow, LoginFlowsResponse

__all__ = [
    "BackupVersionResponse",
    "BasicEvent",
    "ClientEvent",
    "ContextResponse",
    "Device",
    "DeviceLists",
    "DevicesResponse",
    "Direction",
    "EmptyResponse",
    "EventBlock",
    "Forbidden",
    "InvitedRoom",
    "JoinedRoom",
    "KeyBackupData",
    "KeysChangesResponse",
    "KeysClaimResponse",
    "KeysQueryResponse",
    "KeysUploadResponse",
    "LeftRoom",
    "LoginFlow",
    "LoginFlowsResponse",
    "LoginResponse",
    "MatrixClient",
    "MatrixError",
    "MatrixHTTPError",
    "MatrixProtocolError",
    "MatrixUnavailable",
    "MessagesResponse",
    "NotFound",
    "RateLimited",
    "RelationsResponse",
    "Request",
    "RetryPolicy",
    "RoomKeysResponse",
    "RoomKeysRoomResponse",
    "RoomKeysUpdateResponse",
    "RoomMember",
    "Rooms",
    "SendResponse",
    "Session",
    "SignaturesUploadResponse",
    "StateBlock",
    "StrippedStateEvent",
    "SyncResponse",
    "Timeline",
    "ToDevice",
    "ToDeviceEvent",
    "UnknownToken",
    "UploadResponse",
    "WhoAmIResponse",
    "api",
    "crypto_api",
    "parse",
]
