"""Two places that hold different keys for one namespace are refused before anything
starts (casetrail.ops.keys_on_hand): which one the namespace's data is under is not for
a stack to guess. Checked before the database is asked anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.errors import PermanentError
from casetrail.ops.keys_on_hand import refuse_new_keys
from casetrail.trail.keyfile import write_signer


def test_a_configured_key_and_a_different_local_one_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(namespace="two-places",
                        database_url="postgresql://nobody@127.0.0.1:1/none")
    configured = tmp_path / "elsewhere" / "worker.pem"
    write_signer(configured, Signer.generate())
    write_signer(tmp_path / ".casetrail" / "two-places.signing-key.pem", Signer.generate())
    with pytest.raises(PermanentError, match="hold different keys") as refused:
        asyncio.run(refuse_new_keys(settings.model_copy(
            update={"signing_key_file": str(configured)})))
    assert "the worker's signing key" in str(refused.value)
    assert str(configured) in str(refused.value)
    assert "two-places.signing-key.pem" in str(refused.value)


def test_the_same_key_in_both_places_is_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same bytes in both places pass this check (and go on to the database's,
    which here cannot be reached: the error says so, not "different keys")."""
    monkeypatch.chdir(tmp_path)
    settings = Settings(namespace="one-key",
                        database_url="postgresql://nobody@127.0.0.1:1/none")
    local = tmp_path / ".casetrail" / "one-key.signing-key.pem"
    write_signer(local, Signer.generate())
    configured = tmp_path / "copy.pem"
    configured.write_bytes(local.read_bytes())
    with pytest.raises(OSError):
        asyncio.run(refuse_new_keys(settings.model_copy(
            update={"signing_key_file": str(configured)})))
