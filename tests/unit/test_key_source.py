"""Private keys from a file, the environment or an operator's provider
(casetrail.trail.key_source); each missing one is an error naming where it was looked
for, never a new key."""

from __future__ import annotations

from pathlib import Path

import pytest

from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.errors import PermanentError
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import NoteSigner
from casetrail.ops.keys_on_hand import KEY_FILES
from casetrail.trail.keyfile import worker_signer, write_signer
from tests.support import key_provider

PROVIDER = "tests.support.key_provider:make"


def _settings(**updates: str) -> Settings:
    return Settings(namespace="keys", database_url="postgresql://nobody@127.0.0.1:1/none",
                    log_origin="casetrail.test/keys").model_copy(update=updates)


def test_a_key_from_a_file_the_environment_or_a_provider_is_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    signer = Signer.generate()
    write_signer(tmp_path / "worker.pem", signer)
    pem = (tmp_path / "worker.pem").read_bytes()
    monkeypatch.setenv("WORKER_KEY_PEM", pem.decode())
    key_provider.KEYS["worker"] = pem
    for spec, extra in ((str(tmp_path / "worker.pem"), {}),
                        ("env:WORKER_KEY_PEM", {}),
                        ("provider:worker", {"key_provider": PROVIDER})):
        loaded = worker_signer(_settings(signing_key_file=spec, **extra))
        assert loaded.public_key == signer.public_key, spec


def test_the_log_key_from_a_provider_needs_a_state_file_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = NoteSigner.generate("casetrail.test/keys")
    key_provider.KEYS["log"] = log.text().encode()
    settings = _settings(log_key_file="provider:log", key_provider=PROVIDER)
    assert log_signer(settings).verifier.text() == log.verifier.text()
    from casetrail.components.sequencer import ledger_state

    with pytest.raises(PermanentError, match="CASETRAIL_LEDGER_STATE_FILE"):
        ledger_state(settings)
    kept = ledger_state(settings.model_copy(update={"ledger_state_file": "/var/x.json"}))
    assert kept.path == Path("/var/x.json")


@pytest.mark.parametrize(("spec", "extra", "said"), [
    ("env:NOT_SET_ANYWHERE", {}, "the environment has no NOT_SET_ANYWHERE"),
    ("provider:worker", {}, "needs CASETRAIL_KEY_PROVIDER"),
    ("provider:nobody", {"key_provider": PROVIDER}, "has no key 'nobody'"),
    ("provider:worker", {"key_provider": "tests.support.key_provider:absent"},
     "does not make a key provider"),
    ("/nowhere/worker.pem", {}, "cannot read the signing key /nowhere/worker.pem"),
])
def test_a_key_that_cannot_be_had_is_an_error_naming_where_it_was_looked_for(
    spec: str, extra: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    key_provider.KEYS.pop("nobody", None)
    with pytest.raises(PermanentError, match=said):
        worker_signer(_settings(signing_key_file=spec, **extra))


def test_keys_not_in_files_are_not_looked_for_as_files() -> None:
    """`up` checks a missing key file against the database; a key from the environment
    or a provider has no file to be missing."""
    settings = _settings(signing_key_file="env:X", action_key_file="provider:a",
                         log_key_file="provider:l")
    assert all(key.disagreement(settings) is None for key in KEY_FILES)
