"""What `casetrail setup --remove` takes away beside the database: the state files a
stack keeps for the namespace, found where `up` and `demo` put them even from a shell
that never named them, so that a namespace made again under the same name starts clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from casetrail.config import Settings
from casetrail.ops.setup import _local_state


def test_a_shell_that_names_no_key_still_finds_what_up_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CASETRAIL_HOME", str(tmp_path))
    for name in ("CASETRAIL_LOG_KEY_FILE", "CASETRAIL_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "shop.audit-key.pem").write_text("made by setup")  # up's setup made it
    files = _local_state(Settings(namespace="shop"))
    assert files == [tmp_path / "shop.audit-key.pem",
                     tmp_path / "shop.audit-key.pem.shop.state.json",
                     tmp_path / "shop.log-key.shop.state.json"]


def test_configured_keys_are_never_taken_only_their_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CASETRAIL_HOME", str(tmp_path))
    settings = Settings(namespace="shop", audit_key_file=str(tmp_path / "auditor.pem"),
                        log_key_file=str(tmp_path / "log.key"),
                        ledger_state_file=str(tmp_path / "ledger.json"))
    assert _local_state(settings) == [tmp_path / "auditor.pem.shop.state.json",
                                      tmp_path / "ledger.json"]
