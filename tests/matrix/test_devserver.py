"""The Synapse launcher's config and failure path (no server needed)."""

from __future__ import annotations

import os
import select
import stat
from pathlib import Path

import pytest

from gapline.matrix.devserver import (
    SynapseServer,
    SynapseStartError,
    synapse_available,
    synapse_config,
)


def _need_synapse() -> None:
    if synapse_available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("matrix-synapse must be installed under CI=true")
    pytest.skip("matrix-synapse is not installed")


def _exits(pid: int, *, within: float) -> bool:
    """Wait for ``pid`` (not our child) to terminate: a pidfd turns readable when it
    exits, zombie or reaped, so there is no polling and no guessing how long a
    signal takes to land."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already gone and reaped
    try:
        readable, _, _ = select.select([pidfd], [], [], within)
    finally:
        os.close(pidfd)
    return bool(readable)


def test_every_rate_limiter_synapse_reads_is_lifted(tmp_path: Path) -> None:
    _need_synapse()
    from synapse.config.ratelimiting import RatelimitConfig, RatelimitSettings

    parsed = RatelimitConfig(None)  # ty: ignore[invalid-argument-type]
    parsed.read_config(synapse_config(tmp_path, port=8008))
    limiters = {
        name: value
        for name, value in vars(parsed).items()
        if isinstance(value, RatelimitSettings) and name != "remote_media_downloads"
    }
    assert len(limiters) >= 20
    for name, value in limiters.items():
        assert value.per_second >= 10_000 and value.burst_count >= 10_000, name
    assert parsed.rc_federation.reject_limit >= 10_000


def test_config_is_loopback_in_memory_and_uncached(tmp_path: Path) -> None:
    config = synapse_config(tmp_path, port=12345, server_name="localhost")
    (listener,) = config["listeners"]
    assert listener["bind_addresses"] == ["127.0.0.1"] and listener["port"] == 12345
    assert [r["names"] for r in listener["resources"]] == [["client"]]
    assert config["database"] == {"name": "sqlite3", "args": {"database": ":memory:"}}
    assert config["sync_response_cache_duration"] == 0
    assert config["enable_registration"] and config["enable_registration_without_verification"]
    assert config["bcrypt_rounds"] == 4 and config["report_stats"] is False
    assert config["trusted_key_servers"] == []
    assert config["media_store_path"].startswith(str(tmp_path))


def test_start_failure_raises_with_log_tail(tmp_path: Path) -> None:
    _need_synapse()
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'synapse says: boom' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SynapseStartError) as info:
        SynapseServer.start(tmp_path / "server", python=str(broken), startup_timeout=30)
    assert "status 3" in str(info.value)
    assert "synapse says: boom" in info.value.log_tail


def test_start_timeout_kills_the_process_group(tmp_path: Path) -> None:
    _need_synapse()
    pid_file = tmp_path / "child.pid"
    hanging = tmp_path / "hanging-python"
    # A "server" that never answers: it forks a grandchild so the whole group must go.
    hanging.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pid_file}\nexec sleep 600\n")
    hanging.chmod(hanging.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SynapseStartError, match="did not become ready"):
        SynapseServer.start(tmp_path / "server", python=str(hanging), startup_timeout=1.0)
    grandchild = int(pid_file.read_text())
    if not _exits(grandchild, within=30.0):
        pytest.fail("the server's process group survived a failed start")
