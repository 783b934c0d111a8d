"""What the event-log consumer lets into the trail: only events the worker signed.

The checks live in ``casetrail.trail.admission``, shared with the API's live streams (which
must not show what the record would refuse); the consumer uses them from here.
"""

from casetrail.trail.admission import KEY_REFRESH_SECONDS, Admission, KeyRing, Refused

__all__ = ["KEY_REFRESH_SECONDS", "Admission", "KeyRing", "Refused"]
