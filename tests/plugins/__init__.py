"""Agents written as a team outside casetrail would: with the public ``casetrail`` API
only, loaded as plugins (entry points, or ``CASETRAIL_AGENTS``)."""
