"""An insurance-claim triage agent, packaged on its own: casetrail finds it through the
entry points in pyproject.toml."""
