"""The transparency log's key: a signed-note signer key (``PRIVATE+KEY+<origin>+...``) in
a file only the ledger reads, named after the log's origin."""

from __future__ import annotations

import os
from pathlib import Path

from casetrail.config import Settings, local_file
from casetrail.errors import PermanentError
from casetrail.ledger.note import ED25519, NoteError, NoteSigner
from casetrail.trail.key_source import is_file, key_bytes


def write_log_key(path: Path, signer: NoteSigner) -> None:
    """Write a signer key to ``path`` (mode 0600); refuses to overwrite one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(signer.text() + "\n")


def read_log_key(path: Path, kind: int = ED25519) -> NoteSigner:
    try:
        signer = NoteSigner.parse(path.read_text())
    except OSError as exc:
        raise PermanentError(f"cannot read the key {path}: {exc.strerror}") from None
    except NoteError as exc:
        raise PermanentError(f"{path} is not a signed-note signer key: {exc}") from None
    if signer.kind != kind:
        raise PermanentError(f"{path} holds a key of type {signer.kind:#04x}, not "
                             f"{kind:#04x}")
    return signer


def log_signer(settings: Settings) -> NoteSigner:
    """The log's key (``CASETRAIL_LOG_KEY_FILE``), named after the log's origin."""
    if not settings.log_key_file:
        raise PermanentError(
            "CASETRAIL_LOG_KEY_FILE is not set: the ledger signs every checkpoint. Create a "
            "key with `casetrail ledger key generate -o FILE` and point the variable at it.")
    if is_file(settings.log_key_file):
        signer = read_log_key(Path(settings.log_key_file))
    else:
        try:
            signer = NoteSigner.parse(key_bytes(settings.log_key_file,
                                                settings.key_provider).decode())
        except (NoteError, UnicodeDecodeError) as exc:
            raise PermanentError(f"{settings.log_key_file} is not a signed-note signer key: "
                                 f"{exc}") from None
    if signer.name != settings.origin():
        raise PermanentError(f"the log key is named {signer.name!r}, but the log's origin is "
                             f"{settings.origin()!r} (CASETRAIL_LOG_ORIGIN): a checkpoint's "
                             "signer is named after its origin")
    return signer


def ensure_local_log_key(settings: Settings) -> Settings:
    """For a developer stack (``up``, ``demo``): the configured log key, or one made and
    kept under ``CASETRAIL_HOME`` for this namespace. Children started later inherit it."""
    if settings.log_key_file:
        return settings
    path = local_file(f"{settings.namespace}.log-key")
    if not path.exists():
        write_log_key(path, NoteSigner.generate(settings.origin()))
    os.environ["CASETRAIL_LOG_KEY_FILE"] = str(path.resolve())
    return settings.model_copy(update={"log_key_file": str(path.resolve())})
