"""The relay's backend contracts on PostgreSQL (a fresh database per test)."""

from __future__ import annotations

import pytest

from tests.relay.accounts_client_contract import AccountsClientContract
from tests.relay.client_flow_contract import ClientFlowContract
from tests.relay.contacts_contract import ContactsContract
from tests.relay.profiles_routes_contract import ProfilesRoutesContract
from tests.relay.send_batch_contract import SendBatchContract
from tests.relay.timeline_contract import TimelineContract

pytestmark = pytest.mark.postgres


class _OnPostgres:
    @pytest.fixture
    def relay_dsn(self, postgres_dsn: str) -> str:
        return postgres_dsn


class TestTimelinePostgres(_OnPostgres, TimelineContract):
    pass


class TestSendBatchesPostgres(_OnPostgres, SendBatchContract):
    pass


class TestClientFlowPostgres(_OnPostgres, ClientFlowContract):
    pass


class TestProfilesRoutesPostgres(_OnPostgres, ProfilesRoutesContract):
    pass


class TestContactsPostgres(_OnPostgres, ContactsContract):
    pass


class TestAccountsClientPostgres(_OnPostgres, AccountsClientContract):
    pass


del (
    AccountsClientContract,
    ClientFlowContract,
    ContactsContract,
    ProfilesRoutesContract,
    SendBatchContract,
    TimelineContract,
)
