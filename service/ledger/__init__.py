"""The transparency log: every stored event's hash a leaf of one append-only Merkle tree,
signed checkpoints, proofs, and the witness that watches them (docs/design.md, "Trust")."""
