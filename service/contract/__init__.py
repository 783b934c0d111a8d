"""The contract: what crosses a boundary, and the words for it. No I/O.

The events on the bus and in ``event_log`` (``events``) with the canonical bytes, hash
chain and Ed25519 signature that make each one prove itself (``integrity``), the
commands (``commands``), who may do what (``auth``: API keys, scopes, principals), why a
message is set aside (``dead_letters``) and the model providers casetrail speaks
(``model_providers``). Every other room imports these; they import nothing of
casetrail's but ``config`` and ``errors`` (which names its dead-letter codes from here).
"""
