"""casetrail: tool-using LLM agents whose every reasoning cycle survives as evidence."""
