"""The public surface: every exported name resolves and the package stays layered."""

from __future__ import annotations

import gapline.meshline as meshline


def test_all_names_resolve() -> None:
    missing = [name for name in meshline.__all__ if not hasattr(meshline, name)]
    assert missing == []
    assert len(set(meshline.__all__)) == len(meshline.__all__)


def test_error_codes_map_to_the_wire() -> None:
    from gapline.meshline import (
        HTTP_STATUS_BY_CODE,
        JSONRPC_CODE_BY_CODE,
        BadRequest,
        InvalidSignature,
    )

    assert HTTP_STATUS_BY_CODE[BadRequest("x").code] == 400
    assert JSONRPC_CODE_BY_CODE[InvalidSignature("x").code] == -32004
    assert set(HTTP_STATUS_BY_CODE) <= set(JSONRPC_CODE_BY_CODE)
