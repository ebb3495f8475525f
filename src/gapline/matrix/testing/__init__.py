"""An in-memory Matrix homeserver for unit tests and fault injection.

`FakeHomeserver` models the parts of Synapse's client-server API that gapline
uses, and serves them through ``httpx.MockTransport``, so a real
`MatrixClient` (and everything above it) talks to it unchanged::

    fake = FakeHomeserver()
    alice = fake.register("alice")                   # -> Session
    room = fake.create_room(alice.user_id, name="demo")
    ids = fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(120)])
    fake.fail("messages", status=502, on_call=2)     # the 2nd /messages page fails once

    async with fake.client(alice) as client:         # a MatrixClient on the fake
        page = await client.messages(room, dir="b", limit=50)

Seeding methods (``register``, ``create_room``, ``send_*``, ``redact``,
``invite``/``join``/``leave``/``kick``, ``hide_history_before``, ``revoke``,
``set_displayname``, ``set_typing``) act directly on the model, with no HTTP and
no faults, and take plain user IDs. Everything a client does goes through HTTP.

The model (faithful to Synapse 1.163 where it matters; tests/matrix/test_fake_parity.py
runs the same scenarios against the fake and a real Synapse; see docs/matrix.md):

- One global stream ordering; every event, receipt and account-data change
  advances it. Each room holds its events in stream order (no DAG forks).
- ``/messages`` tokens look like Synapse's (``t42-42_0_0_0_0_0_0_0_0``) and
  mean "between stream positions 42 and 43"; ``/sync`` tokens look like
  ``s42_0_0_0_0_0_0_0_0`` and are accepted by ``/messages`` too. A token that
  does not parse answers 400 ``M_INVALID_PARAM``.
- ``/messages?dir=b`` returns ``end`` on the page holding ``m.room.create``;
  only the next, empty page omits it. A page whose events are all invisible
  to the caller (see `hide_history_before`) comes back *empty but with* an
  ``end``, exactly like Synapse's post-fetch visibility filter, so a client
  must keep paging until ``end`` is absent.
- ``/sync``: default timeline limit 10, or ``filter.room.timeline.limit``;
  ``limited: true`` when more events arrived than fit, and always a
  ``prev_batch`` that paginates back from the first timeline event; the
  ``state`` block holds state between ``since`` and the timeline; receipts
  as ephemeral ``m.receipt``; ``m.fully_read`` as room account data; invites
  under ``rooms.invite``; departures under ``rooms.leave``. With ``since``
  and ``timeout`` and nothing new, it long-polls (really waits) until a
  change or the timeout.
- ``/relations``: children by ``m.relates_to.event_id``, optional rel_type /
  event_type, ``dir``, ``limit`` (default 5), ``from`` / ``next_batch``;
  ``recurse=true`` follows up to 3 levels and reports ``recursion_depth: 3``
  whatever the depth reached (as Synapse does).
- Redaction empties ``content`` (keeping ``membership`` of member events) and
  puts the redaction event under ``unsigned.redacted_because``.
- Served events carry Synapse's bundled aggregations under
  ``unsigned.m.relations``: ``m.replace`` (the newest edit by the original's
  sender, whole) and ``m.thread`` (``latest_event``, ``count``,
  ``current_user_participated``); state events carry ``prev_content``. A
  second identical reaction is refused (400 ``M_DUPLICATE_ANNOTATION``).
- ``/sync`` carries ``m.typing`` when typing changed, a private receipt
  (``m.read.private``) only to its owner, and ``unread_notifications``
  counted like Synapse's default push rules (messages from others after the
  user's receipt; highlights name the user). ``/relations`` takes its own
  ``next_batch`` tokens and ``/messages``/``/sync`` tokens as ``from``.
- ``PUT .../send/{type}/{txnId}`` is idempotent per device and transaction ID,
  and the sending device's echo carries ``unsigned.transaction_id``.
- A member who left or was kicked may still page ``/messages``, clamped at its
  leave event; a user who never joined gets 403 ``M_FORBIDDEN``.
- A request carrying ``access_token`` in its query string is refused (400),
  so a client that leaks its token into URLs fails loudly.

Fault knobs, each returning the `Fault` it installed (``fault.fired`` counts
how often it struck). ``endpoint`` is a name from `ENDPOINTS` or ``"*"``;
``on_call=N`` strikes on the N-th matching request counted from when the
fault was installed; ``times`` is how many consecutive matching requests it
strikes (``None``: forever); ``room_id`` narrows it to one room:

- `fail`: answer an HTTP error (default 500 ``M_UNKNOWN``);
  ``fail``, ``timeout`` and ``disconnect`` take ``after_processing=True``: the
  request takes effect (the event is sent) and only the answer is lost, which
  is what makes a transaction-ID retry observable;
- `rate_limit`: 429 ``M_LIMIT_EXCEEDED`` with ``retry_after_ms``;
- `timeout`: raise ``httpx.ReadTimeout`` (MockTransport enforces no timeouts,
  so this is how a timeout is simulated);
- `disconnect`: raise ``httpx.RemoteProtocolError`` or ``httpx.ReadError``
  (the server closed the connection mid-answer);
- `stall`: sleep ``seconds`` before answering normally (to test cancellation);
  await the fault's ``struck`` event to know the stalled request has arrived;
- `truncate`: a 200 whose JSON body is cut short;
- `malformed`: a 200 whose body is valid JSON of the wrong shape;
- `repeat_cursor`: answer normally but with the pagination cursor equal to the
  one the request came with (``end == from`` for ``/messages``,
  ``next_batch == from`` for ``/relations``, ``next_batch == since`` for ``/sync``);
- `unknown_token`: 401 ``M_UNKNOWN_TOKEN`` (or `revoke` a real token).

Every request is recorded in `FakeHomeserver.requests` (endpoint, method,
path, query, room ID, whether it carried an Authorization header, body).

Waiting for a request instead of sleeping: every `Fault` carries ``struck``,
an `asyncio.Event` set when the fault first strikes (for a stall: the request
has arrived and is sleeping), and ``await fake.wait_requests(endpoint, n)``
returns once ``n`` requests to ``endpoint`` (or ``"*"``) have arrived since the
fake was created, each already matched against the faults and being served::

    stalled = fake.stall("messages", 3600)
    task = asyncio.create_task(client.messages(room))
    await stalled.struck.wait()                      # the request is in its stall
    task.cancel()

Layout (one private module per concern; a new endpoint family, say typing
or to-device, is a new sibling module):

- `_model`: rooms, events, membership, visibility, accounts, account data,
  and the seeding API (`HomeserverModel`, which `FakeHomeserver` extends);
- `_wire`: `Call`/`Reply`/`HTTPError`, tokens and query parameters;
- one module per endpoint family, each an `EndpointFamily` subclass over the
  model: `_login` (versions, login flows, login, register, whoami, logout),
  `_membership` (createRoom, join, leave, invite, kick, joined_members),
  `_sync`, `_messages` (messages, context, event, relations), `_send`
  (send, redact, state), `_receipts` (read markers, receipts),
  `_account_data`, `_media` (upload, download), `_typing` (typing,
  profile display names), `_room_keys` (the server-side key backup: versions and
  keys per room and session; seed and read it through ``fake.room_keys``);
- `_routes`: the one URL table (`Router`) and `ENDPOINTS`;
- `_faults`: `Fault`, `FaultKind`, the knobs, and `inject`, which applies
  them around every handler;
- `_server`: `FakeHomeserver.handle`, which decodes, routes, records and
  answers through `inject`.

Adding a family: write its module (a class deriving `EndpointFamily`, one
coroutine per endpoint taking a `Call`), create it in `Router.__init__`,
add its paths to `Router.route` and its endpoint names to `ENDPOINTS`.
"""

from ._faults import Fault, FaultKind
from ._routes import ENDPOINTS
from ._server import FakeHomeserver, RecordedRequest
from ._sync import DEFAULT_TIMELINE_LIMIT

__all__ = [
    "DEFAULT_TIMELINE_LIMIT",
    "ENDPOINTS",
    "FakeHomeserver",
    "Fault",
    "FaultKind",
    "RecordedRequest",
]
