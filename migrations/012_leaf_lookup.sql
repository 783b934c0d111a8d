-- casetrail schema, version 12: a leaf is found by its hash, not by its event's id.
--
-- GET /ledger/leaves/{hash}/proof serves anyone an inclusion proof for a hash they hold
-- (a bundle's event, a trail's terminal event): it tells nothing to someone without
-- the hash. A public lookup by event id told anyone holding a case id how many events
-- the case has (event ids derive from the case id); that lookup is now a case's own,
-- behind the case's access rules (GET /cases/{id}/events/{eventId}/proof).
ALTER TABLE ledger_leaves ADD COLUMN event_hash text CHECK (event_hash ~ '^[0-9a-f]{64}$');
-- The leaves logged so far get their hash (the one time a leaf row is written to).
ALTER TABLE ledger_leaves DISABLE TRIGGER ledger_leaves_append_only;
UPDATE ledger_leaves l SET event_hash = e.hash FROM event_log e WHERE e.event_id = l.event_id;
ALTER TABLE ledger_leaves ENABLE ALWAYS TRIGGER ledger_leaves_append_only;
CREATE INDEX ledger_leaves_event_hash ON ledger_leaves (event_hash);
