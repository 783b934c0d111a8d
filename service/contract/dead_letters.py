"""Why a message was set aside on ``<ns>.dead-letter``: the reason's class, one word (the
``casetrail_dead_lettered`` metric's ``reason`` label and the alerts on it); the reason
itself, free text, travels in the message's ``x-casetrail-reason`` header."""

from __future__ import annotations

from enum import StrEnum


class DeadLetterCode(StrEnum):
    """Every class of reason a component sets a message aside for."""

    REJECTED = "rejected"
    """Refused, without a more precise class."""
    UNPROCESSABLE = "unprocessable"
    """Read, but never processable here (a case the worker cannot run)."""
    UNREADABLE = "unreadable"
    """Not a valid event or command."""
    FOREIGN_SENDER = "foreign_sender"
    """Published by a broker user that may not send it."""
    FORGED_START = "forged_start"
    """A start command for a case row whose signed start does not hold."""
    FORGED_ERASE = "forged_erase"
    """An erase command whose erasure no registered action key signed for that case."""
    WRONG_CALL = "wrong_call"
    """A tool reply for another call than its correlation id's."""
    INTERNAL_ERROR = "internal_error"
    """The handler raised an exception nothing translated (a bug)."""
    UNSIGNED = "unsigned"
    """An event without its integrity header."""
    BAD_INTEGRITY = "bad_integrity"
    """An integrity header that is not well formed."""
    HASH_MISMATCH = "hash_mismatch"
    """The body does not hash to the integrity's hash."""
    UNKNOWN_KEY = "unknown_key"
    """Signed with a key nobody registered."""
    RETIRED_KEY = "retired_key"
    """Signed with a retired key."""
    BAD_SIGNATURE = "bad_signature"
    """A signature that does not verify."""
    CONFLICT = "conflict"
    """Other content for an event already stored (first write wins)."""
    DATABASE_REFUSED = "database_refused"
    """Postgres refused the event (a constraint or the append-only trigger)."""
