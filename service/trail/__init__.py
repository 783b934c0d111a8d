"""The trail: how a record is written and the rules by which it is taken as genuine.
No I/O.

How every event is redacted, chained and signed before a transport carries it
(``emitter``); what the event-log consumer and the live streams take as a genuine event
(``admission``), whether a stored trail is intact (``verification``), a person's signed
action (``person_actions``) and the signing keys on disk (``keyfile``). The bytes and
signatures they check are the contract's (``casetrail.contract.integrity``).
"""
