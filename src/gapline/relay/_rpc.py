"""Method dispatch shared by both transports: metrics, logging, error mapping, quotas."""

from __future__ import annotations

import logging
import time
from typing import Any

from gapline.meshline import MeshlineError
from gapline.relay._errors import RelayFailure, failure_from_meshline, internal_failure
from gapline.relay._methods import Call, Method
from gapline.relay._metrics import RelayMetrics
from gapline.relay._ratelimit import ChallengeQuota
from gapline.storage import BackendClosed, StorageError

__all__ = ["invoke", "unexpected"]

log = logging.getLogger("gapline.relay")

# Methods that consume a challenge nonce on their first attempt, whatever the outcome.
_CONSUMERS = frozenset({"auth.device.verify", "auth.account.verify"})


def unexpected(metrics: RelayMetrics, transport: str, method: str | None = None) -> RelayFailure:
    """The answer to an exception nobody expected (call inside its ``except``).

    One JSON log record at error level carries the traceback and an error id; the
    client gets ``internal_error`` with that id and nothing else about it.
    """
    failure = internal_failure()
    assert failure.data is not None
    log.error(
        "unexpected failure",
        exc_info=True,
        extra={"method": method, "transport": transport, "error_id": failure.data["error_id"]},
    )
    metrics.internal_errors.labels(transport).inc()
    if method is not None:
        metrics.errors.labels(method, "internal_error").inc()
    return failure


async def invoke(
    method: Method,
    call: Call,
    params: dict[str, Any],
    metrics: RelayMetrics,
    transport: str,
    *,
    quota: ChallengeQuota | None = None,
    address: str = "?",
) -> Any:
    """Run ``method``; every failure leaves as :class:`RelayFailure`.

    With ``quota``, ``auth.challenge`` is refused (``rate_limited``) while the address
    or the account holds its share of outstanding nonces, and the verify methods give
    back the nonce they consume.
    """
    name = method.name
    if quota is not None and name == "auth.challenge":
        wait = quota.check(address, params.get("account"))
        if wait:
            metrics.rate_limited.inc()
            raise RelayFailure(
                "rate_limited", "too many outstanding challenges", {"retry_after": wait}
            )
    requests, latency = metrics.request_children(name, transport)
    requests.inc()
    start = time.perf_counter()
    try:
        result = await method.handler(call, params)
    except RelayFailure as exc:
        metrics.errors.labels(name, exc.code).inc()
        raise
    except MeshlineError as exc:
        failure = failure_from_meshline(exc)
        metrics.errors.labels(name, failure.code).inc()
        raise failure from None
    except BackendClosed:
        metrics.errors.labels(name, "temporarily_unavailable").inc()
        raise RelayFailure("temporarily_unavailable", "the relay is shutting down") from None
    except StorageError:
        log.exception("storage failure", extra={"method": name})
        metrics.errors.labels(name, "internal_error").inc()
        raise RelayFailure("internal_error", "storage failure") from None
    except Exception:  # noqa: BLE001 - logged with an error id by unexpected()
        raise unexpected(metrics, transport, name) from None
    finally:
        latency.observe(time.perf_counter() - start)
        if quota is not None and name in _CONSUMERS:
            quota.consumed(params.get("nonce"))
    if quota is not None and name == "auth.challenge":
        quota.issued(result["nonce"], address, params["account"], result["expires_at"])
    return result
