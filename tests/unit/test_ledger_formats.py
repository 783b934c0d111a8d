"""The transparency log's tree, proofs, notes and keys, on their own (against Go's
reference implementation: tests/integration/test_tlog_interop.py)."""

from __future__ import annotations

import hashlib

import pytest

from casetrail.ledger import merkle
from casetrail.ledger.note import (
    COSIGNATURE_V1,
    Checkpoint,
    Note,
    NoteError,
    NoteSigner,
    TlogProof,
    Verifier,
    cosign,
    open_checkpoint,
    sign,
)
from casetrail.ledger.proofs import LoggedEvent, check_log
from tests.support import ROOT
from tests.support.merkle import data, grown, mth


def test_roots_and_proofs_from_tiles_match_the_rfc_definition() -> None:
    leaves = data(600)
    edge, tiles = grown(leaves)
    read = merkle.tile_entries(tiles)
    assert edge.size == 600 and edge.root() == mth(leaves)
    for size in (1, 2, 3, 7, 8, 255, 256, 257, 511, 512, 513, 600):
        root = mth(leaves[:size])
        assert merkle.root(read, size) == root
        for index in {0, size // 3, size // 2, size - 1}:
            path = [merkle.range_hash(read, lo, hi)
                    for lo, hi in merkle.inclusion_ranges(index, size)]
            assert merkle.verify_inclusion(merkle.leaf_hash(leaves[index]), index, size, path,
                                           root)
            other = merkle.leaf_hash(leaves[(index + 1) % 600])
            assert not merkle.verify_inclusion(other, index, size, path, root)
            if path:
                bent = [path[0][:-1] + bytes([path[0][-1] ^ 1]), *path[1:]]
                assert not merkle.verify_inclusion(merkle.leaf_hash(leaves[index]), index,
                                                   size, bent, root)
        for old in {1, size // 2, size - 1, size}:
            if old < 1:
                continue
            path = [merkle.range_hash(read, lo, hi)
                    for lo, hi in merkle.consistency_ranges(old, size)]
            assert merkle.verify_consistency(old, mth(leaves[:old]), size, root, path)
            if old < size:
                forged = mth([b"x" * 32, *leaves[1:old]])
                assert not merkle.verify_consistency(old, forged, size, root, path)
    assert merkle.verify_consistency(0, merkle.EMPTY_ROOT, 5, mth(leaves[:5]), [])


def test_a_tree_of_more_than_65536_leaves_uses_three_tile_levels() -> None:
    leaves = data(70_000)
    edge, tiles = grown(leaves)
    assert {level for level, _ in tiles} == {0, 1, 2}
    read = merkle.tile_entries(tiles)
    assert merkle.root(read, 70_000) == edge.root()
    assert merkle.root(read, 65_536) == merkle.merge(
        [merkle.subtree_hash(read, (8, i)) for i in range(256)])


def test_notes_checkpoints_and_cosignatures() -> None:
    log = NoteSigner.generate("audit.example.com/log")
    head = Checkpoint("audit.example.com/log", 42, hashlib.sha256(b"root").digest())
    note = sign(head.text(), log)
    rendered = note.render()
    assert rendered.startswith("audit.example.com/log\n42\n")
    assert "\n\n\u2014 audit.example.com/log " in rendered
    assert open_checkpoint(rendered, log.verifier)[0] == head
    assert Verifier.parse(log.verifier.text()) == log.verifier
    assert NoteSigner.parse(log.text()).verifier == log.verifier
    # Another key, a changed size, a key named for another origin: refused.
    with pytest.raises(NoteError, match="no valid signature"):
        open_checkpoint(rendered, NoteSigner.generate("audit.example.com/log").verifier)
    with pytest.raises(NoteError, match="no valid signature"):
        open_checkpoint(rendered.replace("\n42\n", "\n43\n"), log.verifier)
    elsewhere = NoteSigner.generate("elsewhere/log")
    with pytest.raises(NoteError, match="origin"):
        open_checkpoint(sign(head.text(), elsewhere).render(), elsewhere.verifier)
    # A witness's cosignature/v1 travels as one more signature line.
    witness = NoteSigner.generate("witness.example.com/w1", COSIGNATURE_V1)
    line = cosign(note, witness, 1_700_000_000)
    cosigned = Note.parse(note.with_signatures(line).render())
    found = cosigned.signed_by(witness.verifier)
    assert found is not None and found.timestamp == 1_700_000_000
    assert cosigned.signed_by(log.verifier) is not None
    assert Note.parse(note.render()).signed_by(witness.verifier) is None
    with pytest.raises(NoteError):
        Verifier.parse(log.verifier.text().replace("+", "+0", 1))


def test_a_bundles_log_proofs_are_checked_against_the_checkpoint() -> None:
    leaves = data(37)
    edge, tiles = grown(leaves)
    read = merkle.tile_entries(tiles)
    log = NoteSigner.generate("audit.example.com/log")
    note = sign(Checkpoint(log.name, 37, edge.root()).text(), log).render()

    def event(index: int, proof_index: int | None = None) -> LoggedEvent:
        path = [merkle.range_hash(read, lo, hi)
                for lo, hi in merkle.inclusion_ranges(proof_index or index, 37)]
        return LoggedEvent(1, index, leaves[index].hex(),
                           TlogProof(proof_index or index, tuple(path), note).render())

    good = check_log(note, [event(3), event(30)], [log.verifier], [])
    assert good.problems == [] and good.trusted and good.logged == 2
    wrong_place = check_log(note, [event(3, proof_index=4)], [log.verifier], [])
    assert [p.code for p in wrong_place.problems] == ["bad_log_proof"]
    unproven = check_log(note, [LoggedEvent(1, 0, leaves[0].hex(), None)], [log.verifier], [])
    assert [p.code for p in unproven.problems] == ["not_in_log"]
    untrusted = check_log(note, [event(3)], [NoteSigner.generate(log.name).verifier], [])
    assert [p.code for p in untrusted.problems] == ["bad_checkpoint"]
    witness = NoteSigner.generate("w.example/1", COSIGNATURE_V1)
    uncosigned = check_log(note, [event(3)], [log.verifier], [witness.verifier])
    assert [p.code for p in uncosigned.problems] == ["missing_cosignature"]
    assert TlogProof.parse(event(5).proof or "").index == 5


def test_the_log_test_vectors_in_docs_bundle_md() -> None:
    """docs/bundle.md's log vectors, recomputed from their inputs."""
    doc = (ROOT / "docs" / "bundle.md").read_text()
    log = NoteSigner("casetrail.example/log", 0x01, bytes(range(32)))
    leaves = [bytes.fromhex("4b936435d3c7fff1e716be3400805ab880249621a1c0af2b0dfdc314df3d81c6"),
              bytes.fromhex("dcfcd2bbb1d1ae3aae9b7157ff3e0b94d5f2d2a46d70bf62cd1249a66be819ca")]
    hashes = [merkle.leaf_hash(d) for d in leaves]
    root = merkle.node_hash(*hashes)
    note = sign(Checkpoint(log.name, 2, root).text(), log)
    witness = NoteSigner("witness.example/w1", COSIGNATURE_V1, bytes(range(32, 64)))
    for text in (log.verifier.text(), hashes[0].hex(), hashes[1].hex(), root.hex(),
                 note.render(), TlogProof(1, (hashes[0],), note.render()).render()[:70],
                 witness.verifier.text(), cosign(note, witness, 1764547200).line()):
        assert text in doc, text
    assert merkle.verify_inclusion(hashes[1], 1, 2, [hashes[0]], root)


def test_the_report_reads_the_bundles_checkpoint_note() -> None:
    """The PDF said "checkpoint of tree size ?": the bundle holds the signed note's text,
    which the report now reads (size, origin, root, who signed)."""
    from casetrail.audit.report import _logged
    from casetrail.ledger.note import Checkpoint, NoteSigner, sign

    signer = NoteSigner.generate("casetrail.example/log")
    note = sign(Checkpoint("casetrail.example/log", 12_345, bytes(range(32))).text(), signer)
    bundle = {"events": [{"logProof": "p"}, {"logProof": "p"}, {}],
              "log": {"checkpoint": note.render()}}
    said = _logged(bundle)
    assert said.startswith("2 event(s) with an inclusion proof, in the checkpoint of tree "
                           "size 12,345 (log casetrail.example/log, root ")
    assert "signed by casetrail.example/log" in said and "?" not in said
    broken = _logged({"events": [], "log": {"checkpoint": "nonsense"}})
    assert "the checkpoint is unreadable" in broken
