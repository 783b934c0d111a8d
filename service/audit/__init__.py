"""The audit: a case's record read back as evidence.

Verified against the registered keys or exported as an offline bundle (``evidence``),
rendered for a person (``rendering``) or as a PDF report (``report``), replayed through
the agent's current code (``replay``), and read back as the conversation a new attempt
resumes from (``resume``).
"""
