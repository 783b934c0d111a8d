"""What the tiers share: fixtures on the real services (``fixtures``), the stack in
process or as processes (``stack``), fake model servers, builders of events and records,
and the CLI as a subprocess. No test module imports another; they import from here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (docs/, migrations/, examples/, bench/)."""
