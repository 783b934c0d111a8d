"""Keys are never silently replaced (docs/operations.md, "Backup and restore").

``casetrail up`` and ``demo`` make the keys a developer stack needs when they are missing,
and ``setup`` makes a master key when the secrets file holds none. For a namespace whose
database already holds data, a missing key is not a missing file: it is the key that
data was signed, chained or sealed under. A new one would make its personal data
unreadable for good, or the log's checkpoints unverifiable by its witnesses. So before
anything is made, this check looks at what the database holds and refuses, naming each
missing key and where it looked. Making a new key for such a namespace is an operator's
explicit step (``casetrail signer generate`` and ``register``), never a side effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from casetrail.adapters.store.keys import keys_in_use
from casetrail.config import Settings, local_file
from casetrail.errors import PermanentError
from casetrail.privacy.sensitive import Vault
from casetrail.trail.key_source import is_file


@dataclass(frozen=True)
class KeyFile:
    """A key a stack reads from a file, and the table that says data depends on it."""

    what: str
    setting: str
    default_name: str
    table: str

    def local(self, settings: Settings) -> Path:
        return local_file(self.default_name.format(ns=settings.namespace))

    def path(self, settings: Settings) -> Path:
        configured = getattr(settings, self.setting)
        return Path(configured) if configured else self.local(settings)

    def disagreement(self, settings: Settings) -> str | None:
        """Where the configured file and the stack's own (``local_file``) both hold this
        key, and they differ: which one the namespace's data is under is not for a stack
        to guess."""
        if not is_file(getattr(settings, self.setting) or ""):
            return None
        configured, local = self.path(settings), self.local(settings)
        if configured.resolve() == local.resolve() or not (configured.is_file()
                                                            and local.is_file()):
            return None
        if configured.read_bytes() == local.read_bytes():
            return None
        return (f"{self.what}: {configured.resolve()} (CASETRAIL_{self.setting.upper()}) and "
                f"{local.resolve()} hold different keys for this namespace")


KEY_FILES = (
    KeyFile("the worker's signing key", "signing_key_file", "{ns}.signing-key.pem",
            "signing_keys"),
    KeyFile("the API's action key", "action_key_file", "{ns}.action-key.pem", "action_keys"),
    KeyFile("the log's key", "log_key_file", "{ns}.log-key", "ledger_keys"),
)


async def missing_keys(settings: Settings, *, key_files: bool = True) -> list[str]:
    """What the namespace's data needs that is not on hand, each with where it looked:
    the master key always, the key files too when ``key_files`` (``up`` and ``demo``,
    which would make them; ``setup`` may not read the private keys)."""
    held = await keys_in_use(settings.database_url, [key.table for key in KEY_FILES])
    if held is None:
        return []  # no database yet: nothing depends on any key
    missing = []
    for key in KEY_FILES if key_files else ():
        if not is_file(getattr(settings, key.setting) or ""):
            continue  # env: or provider: — the component says so if it cannot have it
        path = key.path(settings)
        if not path.exists() and held.registered[key.table]:
            missing.append(f"{key.what}: {path.resolve()} does not exist, but the "
                           f"database has {held.registered[key.table]} in {key.table}")
    return missing + _master_key_problems(settings, held.sealed)


def _master_key_problems(settings: Settings, sealed: dict[str, int]) -> list[str]:
    if not sealed:
        return []
    text = settings.master_key.get_secret_value() if settings.master_key is not None \
        else settings.stored_secrets().get("master_key")
    where = f"CASETRAIL_MASTER_KEY or master_key in {settings.secrets_path().resolve()}"
    cases = sum(sealed.values())
    if not text:
        return [f"the master key: not in {where}, but {cases} cases' personal data is "
                f"sealed under it (key id {', '.join(sorted(sealed))})"]
    key_id = Vault.from_text(text).key_id
    if key_id in sealed:  # the key on hand is the data's (some may predate a rotation)
        return []
    return [f"the master key: the one in {where} (key id {key_id}) is not the one any of "
            f"the {cases} cases' personal data is sealed under (key id "
            f"{', '.join(sorted(sealed))})"]


async def refuse_new_keys(settings: Settings, *, key_files: bool = True) -> None:
    """``PermanentError`` listing every key the namespace's data needs and lacks."""
    differing = [d for key in KEY_FILES if (d := key.disagreement(settings))] \
        if key_files else []
    if differing:
        raise PermanentError("two places hold different keys, and nothing is started on a "
                             "guess: " + "; ".join(differing) + ". Keep the one the "
                             "namespace's data is under and move the other away.")
    missing = await missing_keys(settings, key_files=key_files)
    if missing:
        raise PermanentError(
            f"the namespace {settings.namespace} holds data that needs keys which are not "
            "here, and none is made in their place: " + "; ".join(missing) + ". Restore "
            "them from the backup (docs/operations.md, \"Backup and restore\"); making new "
            "ones is an explicit operator step, never a side effect of up, demo or setup.")
