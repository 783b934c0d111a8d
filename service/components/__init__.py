"""The components, each its own process: the case worker (``worker``), the capability
worker (``capability_worker``), the log's sequencer (``sequencer``), and what they share:
one way to start and stop (``runtime``), signals and children (``supervisor``), the
sweeper for accepted cases nobody runs (``sweeper``) and the collector's settings
(``gc_tuning``). The API is ``casetrail.api``; the event-log consumer is
``casetrail.consumers``."""
