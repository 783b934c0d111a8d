"""Metrics and traces: how casetrail is operated."""
