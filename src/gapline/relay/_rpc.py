"""Method dispatch shared by both transports: metrics, logging, error mapping."""

from __future__ import annotations

import logging
import time
from typing import Any

from gapline.meshline import MeshlineError
from gapline.relay._errors import RelayFailure, failure_from_meshline
from gapline.relay._methods import Call, Method
from gapline.relay._metrics import RelayMetrics
from gapline.storage import BackendClosed, StorageError

__all__ = ["invoke"]

log = logging.getLogger("gapline.relay")


async def invoke(
    method: Method, call: Call, params: dict[str, Any], metrics: RelayMetrics, transport: str
) -> Any:
    """Run ``method``; every failure leaves as :class:`RelayFailure`."""
    requests, latency = metrics.request_children(method.name, transport)
    requests.inc()
    start = time.perf_counter()
    try:
        return await method.handler(call, params)
    except RelayFailure as exc:
        metrics.errors.labels(method.name, exc.code).inc()
        raise
    except MeshlineError as exc:
        failure = failure_from_meshline(exc)
        metrics.errors.labels(method.name, failure.code).inc()
        raise failure from None
    except BackendClosed:
        metrics.errors.labels(method.name, "temporarily_unavailable").inc()
        raise RelayFailure("temporarily_unavailable", "the relay is shutting down") from None
    except StorageError:
        log.exception("storage failure", extra={"method": method.name})
        metrics.errors.labels(method.name, "internal_error").inc()
        raise RelayFailure("internal_error", "storage failure") from None
    except Exception:
        log.exception("unexpected failure", extra={"method": method.name})
        metrics.errors.labels(method.name, "internal_error").inc()
        raise RelayFailure("internal_error", "unexpected relay failure") from None
    finally:
        latency.observe(time.perf_counter() - start)
