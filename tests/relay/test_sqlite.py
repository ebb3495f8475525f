"""The relay's backend contracts on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.relay.client_flow_contract import ClientFlowContract
from tests.relay.send_batch_contract import SendBatchContract
from tests.relay.timeline_contract import TimelineContract


class _OnSQLite:
    @pytest.fixture
    def relay_dsn(self, tmp_path: Path) -> str:
        return str(tmp_path / "relay.db")


class TestTimelineSQLite(_OnSQLite, TimelineContract):
    pass


class TestSendBatchesSQLite(_OnSQLite, SendBatchContract):
    pass


class TestClientFlowSQLite(_OnSQLite, ClientFlowContract):
    pass


del ClientFlowContract, SendBatchContract, TimelineContract
