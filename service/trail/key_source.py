"""Where a private key comes from (docs/operations.md, "Where keys come from").

Every setting that names a private key (``CASETRAIL_SIGNING_KEY_FILE``,
``CASETRAIL_ACTION_KEY_FILE``, ``CASETRAIL_LOG_KEY_FILE``) takes one of:

- a file path (the default provider): the key's own file, mode 0600;
- ``env:NAME``: the key's text in the environment variable ``NAME`` (for an orchestrator
  that injects secrets as variables);
- ``provider:NAME``: the key called ``NAME`` from the operator's key provider, a
  ``KeyProvider`` named by ``CASETRAIL_KEY_PROVIDER`` as ``package.module:factory``
  (for a secrets manager or a KMS that releases key material to an authorized host).

A key that cannot be had is a ``PermanentError`` saying where it was looked for; it is
never replaced by a new one.
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from casetrail.errors import PermanentError

ENV = "env:"
PROVIDER = "provider:"


@runtime_checkable
class KeyProvider(Protocol):
    """An operator's source of private keys: the key's bytes (the same text its file would
    hold: a PEM key, or a signed-note signer key), or ``KeyError`` when it has none."""

    def private_key(self, name: str) -> bytes: ...


def is_file(spec: str) -> bool:
    """``spec`` names a file (not ``env:`` or ``provider:``)."""
    return not spec.startswith((ENV, PROVIDER))


@cache
def _provider(factory: str) -> KeyProvider:
    module, _, attribute = factory.partition(":")
    try:
        made = getattr(importlib.import_module(module), attribute)()
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise PermanentError(f"CASETRAIL_KEY_PROVIDER={factory!r} does not make a key "
                             f"provider: {exc}") from None
    if not isinstance(made, KeyProvider):
        raise PermanentError(f"CASETRAIL_KEY_PROVIDER={factory!r} made {type(made).__name__}, "
                             "which has no private_key(name)")
    return made


def key_bytes(spec: str, provider: str | None = None) -> bytes:
    """The key ``spec`` names; ``PermanentError`` saying where it looked."""
    if spec.startswith(ENV):
        name = spec.removeprefix(ENV)
        value = os.environ.get(name)
        if not value:
            raise PermanentError(f"the key {spec!r}: the environment has no {name}")
        return value.encode()
    if spec.startswith(PROVIDER):
        name = spec.removeprefix(PROVIDER)
        if not provider:
            raise PermanentError(f"the key {spec!r} needs CASETRAIL_KEY_PROVIDER "
                                 "(package.module:factory)")
        try:
            return _provider(provider).private_key(name)
        except KeyError:
            raise PermanentError(f"the key provider {provider!r} has no key {name!r}") from None
    try:
        return Path(spec).read_bytes()
    except OSError as exc:
        raise PermanentError(f"cannot read the key {spec}: {exc.strerror}") from None
