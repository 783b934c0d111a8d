"""The trail: the rules by which a record is taken as genuine. No I/O.

What the event-log consumer and the live streams take as a genuine event
(``admission``), whether a stored trail is intact (``verification``), a person's signed
action (``person_actions``) and the signing keys on disk (``keyfile``). The bytes and
signatures they check are the contract's (``casetrail.contract.integrity``).
"""
