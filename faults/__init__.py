"""Fault injection: the real stack, the real broker and database, real failures."""
