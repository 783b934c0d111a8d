"""The archive's files without a stack: a manifest signed over what it lists, files
written once and never over another, and dropping archiving counted as keeping less."""

from __future__ import annotations

import errno
import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from casetrail.audit.archive import ArchiveWriter
from casetrail.audit.archive_check import verify_archive
from casetrail.audit.archive_store import DirectoryArchive, durable
from casetrail.audit.evidence import TrustedKey
from casetrail.contract.integrity import Signer
from casetrail.trail.retention_actions import keeps_less, policy_object

AT = datetime(2026, 12, 5, tzinfo=UTC)
BUNDLE = {"format": "casetrail-bundle/1", "caseId": "0192f0c4-0000-7000-8000-000000000001",
          "tenantId": "default", "events": []}


def test_a_manifest_lists_each_file_by_digest_and_is_signed_over_it(tmp_path: Path) -> None:
    signer = Signer.generate()
    written = ArchiveWriter(DirectoryArchive(tmp_path), signer, "retention:test").write([BUNDLE])
    (entry,) = written
    data = (tmp_path / entry.file).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry.sha256
    assert entry.file.startswith(f"bundles/default/{BUNDLE['caseId']}-{entry.sha256[:16]}")
    manifest = orjson.loads((tmp_path / entry.manifest).read_bytes())
    assert manifest["bundles"][0]["sha256"] == entry.sha256
    # The bundle has no events, so it does not verify; the manifest's signature does.
    trusted = verify_archive(DirectoryArchive(tmp_path), [TrustedKey(signer.public_key)])
    assert [p.kind for p in trusted.problems] == ["bundle"], trusted.problems
    stranger = verify_archive(DirectoryArchive(tmp_path),
                              [TrustedKey(Signer.generate().public_key)])
    assert {p.kind for p in stranger.problems} == {"manifest", "unlisted"}
    manifest["bundles"][0]["bytes"] += 1
    (tmp_path / entry.manifest).write_bytes(orjson.dumps(manifest))
    changed = verify_archive(DirectoryArchive(tmp_path), [TrustedKey(signer.public_key)])
    assert any("signature does not hold" in p.detail for p in changed.problems)


def test_a_file_is_never_written_over_another(tmp_path: Path) -> None:
    target = tmp_path / "bundles" / "x.json"
    durable(target, b"first")
    with pytest.raises(FileExistsError):
        durable(target, b"second")
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]  # no partial file left


def test_a_mount_without_hard_links_still_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some object-store mounts refuse link(): the file is then created exclusively."""
    def no_links(*_: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "bundles" / "x.json"
    durable(target, b"first")
    with pytest.raises(FileExistsError):
        durable(target, b"second")
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]


def test_a_bundle_archived_again_is_kept_and_a_torn_one_is_named(tmp_path: Path) -> None:
    store = DirectoryArchive(tmp_path)
    store.put_new("x.json", b"whole")
    store.put_new("x.json", b"whole")  # the same bundle again: kept
    (tmp_path / "x.json").unlink()
    (tmp_path / "x.json").write_bytes(b"who")  # a write a crash cut short
    with pytest.raises(OSError, match="not overwritten"):
        store.put_new("x.json", b"whole")
    assert (tmp_path / "x.json").read_bytes() == b"who"
    assert store.read("x.json") == b"who" and store.read("absent.json") is None
    assert store.read("../x.json") is None


def test_dropping_the_archive_keeps_less_and_is_signed_only_when_set() -> None:
    row = {"tenant_id": "t", "agent": "*", "version": 1, "keep_days": 2192,
           "counted_from": "ended", "business_key": None, "personal_data_days": None,
           "reason": "r", "set_by": "alice", "set_at": None, "archive": True}
    assert keeps_less({**row, "archive": False}, row)
    assert not keeps_less(row, {**row, "archive": False})
    assert "archive" not in policy_object({**row, "set_at": AT, "archive": False})
    assert policy_object({**row, "set_at": AT})["archive"] is True

