-- casetrail schema, version 27: a legal hold on the case's own trail (docs/design.md,
-- "Keeping records as long as the law says"). The worker's retention pass appends a
-- signed CASE_HELD to each ended case a hold keeps, once per hold, and CASE_RELEASED
-- when that hold no longer keeps it (two persons released it, or its end time passed).
ALTER TABLE event_log DROP CONSTRAINT event_log_event_type_check;
ALTER TABLE event_log ADD CONSTRAINT event_log_event_type_check CHECK (event_type IN (
    'CASE_STARTED', 'REACT_CYCLE', 'CASE_COMPLETED', 'CASE_FAILED',
    'CASE_TIMED_OUT', 'CASE_CANCELLED', 'CASE_ERASED',
    'CASE_AWAITING_REVIEW', 'CASE_REVIEWED', 'CASE_EXPIRED', 'CASE_HELD',
    'CASE_RELEASED')) NOT VALID;
ALTER TABLE event_log VALIDATE CONSTRAINT event_log_event_type_check;

-- Which ended cases carry a hold's CASE_HELD, and whether its CASE_RELEASED followed:
-- kept by the same trigger that queues each stored event for the ledger (no writer of
-- event_log can skip it), so the pass finds what to record without reading the log.
CREATE TABLE held_cases (
    hold_id  uuid    NOT NULL,
    case_id  uuid    NOT NULL,
    released boolean NOT NULL DEFAULT false,
    PRIMARY KEY (hold_id, case_id)
);
CREATE INDEX held_cases_open ON held_cases (hold_id) WHERE NOT released;

CREATE OR REPLACE FUNCTION event_log_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash)
    SELECT event_id, case_id, hash FROM stored WHERE hash IS NOT NULL
    ORDER BY case_id, attempt, seq;
    -- The administrative events of retention and holds are rare: one look at the batch.
    IF EXISTS (SELECT 1 FROM stored WHERE event_type IN ('CASE_EXPIRED', 'CASE_HELD',
                                                         'CASE_RELEASED')) THEN
        INSERT INTO case_tombstones (case_id, tenant_id, event_id, event_hash, policy_id,
                                     policy_version, events_removed, heads, expired_by,
                                     expired_at)
        SELECT case_id, tenant_id, event_id, hash, (payload ->> 'policyId')::bigint,
               (payload ->> 'policyVersion')::int, (payload ->> 'eventsRemoved')::int,
               payload -> 'heads', payload ->> 'expiredBy', occurred_at
        FROM stored WHERE event_type = 'CASE_EXPIRED'
        ON CONFLICT (case_id) DO NOTHING;
        INSERT INTO held_cases (hold_id, case_id)
        SELECT (payload ->> 'holdId')::uuid, case_id FROM stored
        WHERE event_type = 'CASE_HELD'
        ON CONFLICT DO NOTHING;
        UPDATE held_cases h SET released = true FROM stored s
        WHERE s.event_type = 'CASE_RELEASED' AND h.case_id = s.case_id
          AND h.hold_id = (s.payload ->> 'holdId')::uuid;
    END IF;
    RETURN NULL;
END;
$$;
