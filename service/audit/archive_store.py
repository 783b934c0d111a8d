"""Where archives are kept (docs/operations.md, "Archives"): a directory (a mounted WORM
volume, an object-store mount), or an S3 bucket spoken to directly (``s3://bucket/prefix``,
any S3-compatible store through ``CASETRAIL_ARCHIVE_S3_ENDPOINT``; credentials from the
AWS SDK's own chain: environment, profile, instance role).

Either way a name is written once: a write never replaces another content (a directory
links a fully written file into place; a bucket is asked to refuse an existing key,
``If-None-Match: *``); the same content under its name again is kept, other content
there is an error. A bucket with S3 Object Lock's default retention makes each object
WORM as it is written.
"""

from __future__ import annotations

import errno
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from casetrail.errors import PermanentError
from casetrail.extras import missing

S3_SCHEME = "s3://"


class ArchiveStore(Protocol):
    """Files by name (``bundles/...``, ``manifests/...``); blocking (run it in a thread)."""

    @property
    def location(self) -> str: ...

    def put_new(self, name: str, data: bytes) -> None:
        """``data`` under ``name``, durably, never over other content (``OSError``)."""

    def read(self, name: str) -> bytes | None:
        """The file's bytes; ``None`` if there is none."""

    def names(self, folder: str) -> list[str]:
        """Every file's name under ``folder`` (``manifests`` or ``bundles``), sorted."""


NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS,
                      errno.EMLINK, errno.EXDEV})
"""What ``link`` fails with on a mount that has no hard links (some object-store and
network mounts): the file is then created under its own name, exclusively."""


def _different(name: str, location: str) -> OSError:
    return OSError(f"{name} exists in {location} and does not hold the bytes written now "
                   "(an interrupted write?): not overwritten; check it with `casetrail "
                   "archive verify`")


@dataclass(frozen=True)
class DirectoryArchive:
    directory: Path

    @property
    def location(self) -> str:
        return str(self.directory)

    def put_new(self, name: str, data: bytes) -> None:
        path = self.directory / name
        if path.exists():
            if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(data).digest():
                raise _different(name, self.location)
            return
        durable(path, data)

    def read(self, name: str) -> bytes | None:
        path = self.directory / name
        if ".." in Path(name).parts or not path.is_file():
            return None
        return path.read_bytes()

    def names(self, folder: str) -> list[str]:
        return sorted(p.relative_to(self.directory).as_posix()
                      for p in (self.directory / folder).rglob("*.json"))


def durable(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file ``path`` (never over one) and fsync it and its folder:
    written aside and linked into place, so the name never holds a partial file; on a
    mount without hard links, created exclusively under its name (a crash while writing
    leaves a file whose digest no longer matches its name, which ``archive verify`` and
    the next write name, and nothing overwrites)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    _written(partial, data)
    try:
        os.link(partial, path)  # fails on an existing name: nothing is ever overwritten
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        _written(path, data)
    finally:
        partial.unlink()
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _written(path: Path, data: bytes) -> None:
    """``data`` as the new file ``path`` (``FileExistsError`` if there is one), fsynced."""
    with open(path, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


class S3Archive:
    """An S3 bucket (and key prefix) through boto3."""

    def __init__(self, url: str, endpoint: str | None = None) -> None:
        if why := missing("s3"):
            raise PermanentError(why)
        import boto3  # only where an archive is in a bucket
        from botocore.config import Config

        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"an S3 archive is s3://bucket[/prefix], not {url!r}")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/") + "/" if parts.path.strip("/") else ""
        self._url = url
        # The SDK retries throttling and 5xx itself (its standard mode); a checksum is
        # sent and checked with every object.
        self._client: Any = boto3.client("s3", endpoint_url=endpoint, config=Config(
            retries={"mode": "standard", "max_attempts": 5},
            request_checksum_calculation="when_supported"))

    @property
    def location(self) -> str:
        return self._url

    def put_new(self, name: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data,
                                    IfNoneMatch="*", ContentType="application/json",
                                    ChecksumAlgorithm="SHA256")
        except ClientError as exc:
            if _code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise OSError(f"{self._url}: {name} not written: {exc}") from exc
            if self.read(name) != data:
                raise _different(name, self._url) from exc

    def read(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        if ".." in name.split("/"):
            return None
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=self.prefix + name)
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise OSError(f"{self._url}: {name} not read: {exc}") from exc
        body: bytes = reply["Body"].read()
        return body

    def names(self, folder: str) -> list[str]:
        found = []
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}{folder}/")
        for page in pages:
            found += [o["Key"][len(self.prefix):] for o in page.get("Contents", ())
                      if o["Key"].endswith(".json")]
        return sorted(found)


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def open_archive(location: str | Path, endpoint: str | None = None) -> ArchiveStore:
    """The archive at ``location``: ``s3://bucket[/prefix]`` or a directory."""
    if isinstance(location, str) and location.startswith(S3_SCHEME):
        return S3Archive(location, endpoint)
    return DirectoryArchive(Path(location))
