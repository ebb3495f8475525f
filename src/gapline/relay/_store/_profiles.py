"""Profiles: each account's current ``AccountProfile`` with the certificate that verified it,
and the read that authorization decisions make (profile and device state in one statement).

A publication replaces the stored profile only if it is still the one the caller's checks
were made against (compare-and-set on ``revision``, which counts acceptances): when two
devices publish at once, the loser re-reads and is checked again, so the recency rule is
decided by the protocol library on what is really stored, in every relay process.
"""

from __future__ import annotations

from dataclasses import dataclass

from gapline.storage import Backend, Tx

__all__ = ["AccessRow", "Profiles", "StoredProfile"]


@dataclass(frozen=True, slots=True)
class StoredProfile:
    revision: int  # acceptances so far: 1 for the first profile, +1 per replacement
    updated_at: int
    canonical: str  # the AccountProfile's canonical JSON
    signer_certificate: str  # canonical JSON of the DeviceCertificate that verified it


@dataclass(frozen=True, slots=True)
class AccessRow:
    """What grants, invitations and public discovery are judged on, for one account.

    The texts are None when the caller already holds that revision (or there is none).
    """

    state_revision: int
    state: str | None
    profile_revision: int | None
    profile: str | None


_CURRENT = (
    "SELECT revision, updated_at, canonical, signer_certificate FROM profiles WHERE account = ?"
)

# One statement on the primary keys of both tables. A device state's text (up to 128 KiB)
# and the profile's come back only when they differ from the revisions the caller holds.
_ACCESS = (
    "SELECT s.revision, CASE WHEN s.revision = ? THEN NULL ELSE s.canonical END,"
    " p.revision, CASE WHEN p.revision = ? THEN NULL ELSE p.canonical END"
    " FROM device_states s LEFT JOIN profiles p ON p.account = s.account"
    " WHERE s.account = ?"
)


class Profiles:
    """Stored profiles. Each method is one backend operation."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def current(self, account: str) -> StoredProfile | None:
        def op(tx: Tx) -> StoredProfile | None:
            row = tx.one(_CURRENT, (account,))
            if row is None:
                return None
            return StoredProfile(int(row[0]), int(row[1]), str(row[2]), str(row[3]))

        return await self.backend.read(op)

    async def replace(
        self,
        account: str,
        *,
        expected: int | None,
        updated_at: int,
        canonical: str,
        signer_certificate: str,
    ) -> bool:
        """Store a checked profile if the stored one is still revision ``expected`` (None:
        there was none). False when another publication came first: check again."""

        def op(tx: Tx) -> bool:
            if expected is None:
                row = tx.one(
                    "INSERT INTO profiles (account, revision, updated_at, canonical,"
                    " signer_certificate) VALUES (?, 1, ?, ?, ?)"
                    " ON CONFLICT (account) DO NOTHING RETURNING account",
                    (account, updated_at, canonical, signer_certificate),
                )
            else:
                row = tx.one(
                    "UPDATE profiles SET revision = revision + 1, updated_at = ?, canonical = ?,"
                    " signer_certificate = ? WHERE account = ? AND revision = ? RETURNING account",
                    (updated_at, canonical, signer_certificate, account, expected),
                )
            return row is not None

        return await self.backend.write(op)

    async def access(
        self, account: str, *, state_revision: int = -1, profile_revision: int = -1
    ) -> AccessRow | None:
        """The account's device state and profile; None when this relay holds no state for it.

        ``state_revision`` / ``profile_revision`` are the revisions the caller already has
        parsed: their texts are not sent again.
        """

        def op(tx: Tx) -> AccessRow | None:
            row = tx.one(_ACCESS, (state_revision, profile_revision, account))
            if row is None:
                return None
            return AccessRow(
                int(row[0]),
                None if row[1] is None else str(row[1]),
                None if row[2] is None else int(row[2]),
                None if row[3] is None else str(row[3]),
            )

        return await self.backend.read(op)
