"""The relay's backend contracts on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.relay.accounts_client_contract import AccountsClientContract
from tests.relay.client_flow_contract import ClientFlowContract
from tests.relay.contacts_contract import ContactsContract
from tests.relay.profiles_routes_contract import ProfilesRoutesContract
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


class TestProfilesRoutesSQLite(_OnSQLite, ProfilesRoutesContract):
    pass


class TestContactsSQLite(_OnSQLite, ContactsContract):
    pass


class TestAccountsClientSQLite(_OnSQLite, AccountsClientContract):
    pass


del (
    AccountsClientContract,
    ClientFlowContract,
    ContactsContract,
    ProfilesRoutesContract,
    SendBatchContract,
    TimelineContract,
)
