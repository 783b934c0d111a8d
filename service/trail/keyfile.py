"""Signing keys on disk: the worker's Ed25519 key and the API's action key, each a PEM
file only its owner reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from casetrail.config import Settings, local_file
from casetrail.contract.integrity import (
    IntegrityError,
    Signer,
    public_key_from_text,
    public_key_text,
)
from casetrail.errors import PermanentError
from casetrail.trail.key_source import is_file, key_bytes


def write_signer(path: Path, signer: Signer) -> None:
    """Write ``signer`` to ``path`` (mode 0600); refuses to overwrite a key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(signer.to_pem())


def read_signer(path: Path) -> Signer:
    """The key in ``path``; ``PermanentError`` saying what is wrong with it."""
    try:
        return Signer.from_pem(path.read_bytes())
    except OSError as exc:
        raise PermanentError(f"cannot read the signing key {path}: {exc.strerror}") from None
    except IntegrityError as exc:
        raise PermanentError(f"{path} is not a signing key: {exc}") from None


def read_public_key(path: Path) -> bytes:
    """The public key in ``path``: a worker's PEM key, or its public half as
    ``casetrail signer public`` prints it (base64); ``PermanentError`` if neither."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PermanentError(f"cannot read the key {path}: {exc}") from None
    if "-----BEGIN" in text:
        return read_signer(path).public_key
    try:
        return public_key_from_text(text)
    except IntegrityError as exc:
        raise PermanentError(f"{path} holds neither a signing key nor a public key: "
                             f"{exc}") from None


def write_public_key(path: Path, signer: Signer) -> None:
    """The public half of ``signer`` in ``path`` (base64), for an operator's step that
    must not read the private key (compose's setup registers it from there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(public_key_text(signer.public_key) + "\n")


def worker_signer(settings: Settings) -> Signer:
    """The worker's key, from ``CASETRAIL_SIGNING_KEY_FILE``; without one it must not run."""
    if not settings.signing_key_file:
        raise PermanentError(
            "CASETRAIL_SIGNING_KEY_FILE is not set: the worker signs every event it emits. "
            "Create a key with `casetrail signer generate -o FILE` and point the variable "
            "at it.")
    return signer_from(settings.signing_key_file, settings)


def signer_from(spec: str, settings: Settings) -> Signer:
    """The signing key ``spec`` names: a file, ``env:NAME`` or ``provider:NAME``
    (casetrail.trail.key_source)."""
    if is_file(spec):
        return read_signer(Path(spec))
    try:
        return Signer.from_pem(key_bytes(spec, settings.key_provider))
    except IntegrityError as exc:
        raise PermanentError(f"{spec} is not a signing key: {exc}") from None


def ensure_local_signer(settings: Settings) -> Settings:
    """For a developer stack (``up``, ``demo``): the configured key, or one made and kept
    under ``CASETRAIL_HOME`` for this namespace. Children started later inherit it."""
    return _ensure_local_key(settings, "signing_key_file", "signing-key")


def _ensure_local_key(settings: Settings, setting: Literal["signing_key_file",
                                                            "action_key_file"],
                      kind: str) -> Settings:
    """``settings`` with ``setting`` naming a key file: the configured one, or one made
    and kept as ``<namespace>.<kind>.pem`` under ``CASETRAIL_HOME`` (and in the environment, so that
    children started later inherit it)."""
    if getattr(settings, setting):
        return settings
    path = local_file(f"{settings.namespace}.{kind}.pem")
    if not path.exists():
        write_signer(path, Signer.generate())
    os.environ[f"CASETRAIL_{setting.upper()}"] = str(path.resolve())
    return settings.model_copy(update={setting: str(path.resolve())})


def action_signer(settings: Settings) -> Signer:
    """The API's action key, from ``CASETRAIL_ACTION_KEY_FILE``; without one the API must
    not run (it signs every person's action it keeps)."""
    if not settings.action_key_file:
        raise PermanentError(
            "CASETRAIL_ACTION_KEY_FILE is not set: the API signs every action of a person's "
            "(reviews, answers, cancels of a waiting case). Create a key with `casetrail "
            "signer generate -o FILE`, register it with `casetrail signer register --actions "
            "FILE` (setup does it for CASETRAIL_ACTION_KEY_FILE) and point the variable at it.")
    return signer_from(settings.action_key_file, settings)


def ensure_local_action_key(settings: Settings) -> Settings:
    """For a developer stack (``up``, ``demo``): the configured action key, or one made and
    kept under ``CASETRAIL_HOME`` for this namespace, beside (never inside) the secrets file."""
    return _ensure_local_key(settings, "action_key_file", "action-key")


def local_audit_key(settings: Settings) -> Path:
    """Where a stack keeps the auditor's key when none is configured."""
    return local_file(f"{settings.namespace}.audit-key.pem")


def audit_key_spec(settings: Settings, *, make: bool = False) -> str | None:
    """The auditor's key (``CASETRAIL_AUDIT_KEY_FILE``), or the stack's own
    ``<namespace>.audit-key.pem`` when none is configured: made when missing if ``make``
    (``setup``), else ``None`` when missing."""
    if settings.audit_key_file:
        return settings.audit_key_file
    path = local_audit_key(settings)
    if make and not path.exists():
        write_signer(path, Signer.generate())
    return str(path.resolve()) if path.exists() else None


def audit_signer(settings: Settings) -> Signer:
    """The auditor's key: every pass ``casetrail audit`` keeps is signed with it."""
    spec = audit_key_spec(settings)
    if spec is None:
        raise PermanentError(
            "the auditor has no key: `casetrail audit` signs every pass it keeps. Set "
            "CASETRAIL_AUDIT_KEY_FILE, or run `casetrail setup`, which makes "
            f"{local_audit_key(settings)} and registers it.")
    return signer_from(spec, settings)
