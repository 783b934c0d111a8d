"""The transparency log's trees, proofs, tiles and notes against Go's reference
implementation (golang.org/x/mod/sumdb/tlog and .../note, which wrote the signed-note
format and RFC 6962 trees for Go's checksum database). Needs Go and Debian's
golang.org/x/mod (scripts/ensure-go-interop, which `make test` runs)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from casetrail.ledger import merkle
from casetrail.ledger.note import Checkpoint, NoteSigner, sign
from tests.support import ROOT
from tests.support.merkle import data, grown

GO_SOURCE = ROOT / "tests" / "interop" / "tlogcheck.go"
GOPATH = "/usr/share/gocode"


@pytest.fixture(scope="module")
def go_tlogcheck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Go's reference code, built from Debian's golang.org/x/mod (make test installs it:
    scripts/ensure-go-interop)."""
    go = shutil.which("go")
    assert go and Path(GOPATH, "src/golang.org/x/mod/sumdb/note").is_dir(), (
        "Go and golang.org/x/mod are needed: scripts/ensure-go-interop")
    out = tmp_path_factory.mktemp("go") / "tlogcheck"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH,
           "GOCACHE": str(out.parent / "cache"), "GOFLAGS": ""}
    subprocess.run([go, "build", "-o", str(out), str(GO_SOURCE)], check=True, env=env,
                   timeout=300)
    return out


def test_gos_reference_code_agrees_with_our_trees_proofs_tiles_and_notes(
    go_tlogcheck: Path,
) -> None:
    leaves = data(70_000)
    edge, tiles = grown(leaves)
    read = merkle.tile_entries(tiles)
    sizes = [1, 2, 3, 255, 256, 257, 1000, 65_535, 65_536, 65_537, 70_000]
    inclusions = [(i, n) for n in sizes for i in {0, n // 2, n - 1}]
    consistencies = [(m, n) for n in sizes for m in {1, n // 3, n - 1} if 0 < m < n]
    log = NoteSigner.generate("casetrail.test/interop")
    text = Checkpoint(log.name, 70_000, edge.root()).text()
    b64 = base64.b64encode
    request: dict[str, Any] = {
        "leaves": [b64(d).decode() for d in leaves],
        "sizes": sizes,
        "inclusions": [{"index": i, "size": n, "proof": [
            b64(merkle.range_hash(read, lo, hi)).decode()
            for lo, hi in merkle.inclusion_ranges(i, n)]} for i, n in inclusions],
        "consistencies": [{"old": m, "new": n, "proof": [
            b64(merkle.range_hash(read, lo, hi)).decode()
            for lo, hi in merkle.consistency_ranges(m, n)]} for m, n in consistencies],
        "note": sign(text, log).render(),
        "verifierKey": log.verifier.text(),
        "signerKey": log.text(),
        "text": text,
        "tileSizes": [70_000],
    }
    done = subprocess.run([str(go_tlogcheck)], input=json.dumps(request).encode(),
                          capture_output=True, check=True, timeout=300)
    go = json.loads(done.stdout)
    assert go["roots"] == {str(n): b64(merkle.root(read, n)).decode() for n in sizes}
    assert go["inclusionOk"] == [True] * len(inclusions)
    assert go["inclusionGo"] == [r["proof"] for r in request["inclusions"]]
    assert go["consistencyOk"] == [True] * len(consistencies)
    assert go["noteOk"], go["noteError"]
    assert go["noteText"] == text
    # Ed25519 is deterministic: Go signing with our key writes our note byte for byte.
    assert go["signedByGo"] == sign(text, log).render()
    # Go's tiles (c2sp.org/tlog-tiles, height 8) are the ones the ledger stores.
    ours = {f"70000/{level}/{index}": b64(hashes).decode()
            for (level, index), hashes in tiles.items()}
    assert go["tiles"] == ours
