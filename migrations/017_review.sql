-- casetrail schema, version 17: a person decides, on the record (docs/design.md, "Review").
--
-- A case whose answer a person must decide ends its attempt with CASE_AWAITING_REVIEW
-- and waits, holding no worker: `cases.parked_attempt` is the attempt that ended so
-- (the worker notes it once the event is confirmed), `status` is 'awaiting_review'
-- (the consumer's fold). What a person does about it (a review, an answer to the
-- model's question, or a cancel) is kept in `case_actions`, one row per parked attempt:
-- a second one for the same wait is refused by the primary key. The worker acts only
-- on that row: the next attempt records it (CASE_REVIEWED) and goes on.
ALTER TABLE event_log DROP CONSTRAINT event_log_event_type_check;
ALTER TABLE event_log ADD CONSTRAINT event_log_event_type_check CHECK (event_type IN (
    'CASE_STARTED', 'REACT_CYCLE', 'CASE_COMPLETED', 'CASE_FAILED',
    'CASE_TIMED_OUT', 'CASE_CANCELLED', 'CASE_ERASED',
    'CASE_AWAITING_REVIEW', 'CASE_REVIEWED')) NOT VALID;
ALTER TABLE event_log VALIDATE CONSTRAINT event_log_event_type_check;

ALTER TABLE cases DROP CONSTRAINT cases_status_check;
ALTER TABLE cases ADD CONSTRAINT cases_status_check CHECK (status IN
    ('queued', 'running', 'awaiting_review', 'completed', 'failed', 'timed_out', 'cancelled'));
ALTER TABLE cases
    ADD COLUMN parked_attempt int,
    ADD COLUMN parked_at      timestamptz;

CREATE TABLE case_actions (
    case_id        uuid        NOT NULL REFERENCES cases (case_id) ON DELETE CASCADE,
    parked_attempt int         NOT NULL CHECK (parked_attempt >= 1),
    kind           text        NOT NULL CHECK (kind IN ('review', 'answer', 'cancel')),
    verdict        text        CHECK (verdict IN ('confirm', 'override', 'return')),
    reason         text,
    decision       jsonb,
    reviewer       jsonb,
    acted_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (case_id, parked_attempt),
    CHECK ((kind = 'review') = (verdict IS NOT NULL AND reviewer IS NOT NULL
                                AND reason IS NOT NULL)),
    CHECK ((verdict = 'override') = (decision IS NOT NULL))
);

-- The review queue, oldest first (GET /reviews).
CREATE INDEX cases_awaiting_review ON cases (tenant_id, parked_at, case_id)
    WHERE status = 'awaiting_review';

-- API keys made for a person (`keys create --person ID`): reviews and answers need
-- one, and the four-eyes rules compare persons, not keys.
ALTER TABLE api_keys ADD COLUMN person text
    CHECK (person IS NULL OR person ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$');

-- One row per review, from the signed trail. Runs with the reader's rights, so a
-- tenant's SQL reader sees its own rows only (row-level security on event_log).
CREATE VIEW case_reviews WITH (security_invoker = true) AS
SELECT r.case_id,
       r.tenant_id,
       r.attempt,
       r.seq,
       r.payload -> 'reviewer' ->> 'subject'  AS reviewer,
       r.payload -> 'reviewer' ->> 'via'      AS reviewer_via,
       r.payload -> 'reviewer' ->> 'keyId'    AS reviewer_key_id,
       r.payload -> 'reviewer' ->> 'name'     AS reviewer_name,
       r.payload ->> 'verdict'                AS verdict,
       r.payload -> 'decision' ->> 'decision' AS decision,
       r.payload -> 'decision'                AS decision_answer,
       r.payload ->> 'reason'                 AS reason,
       (r.payload ->> 'reviewedAt')::timestamptz AS reviewed_at,
       r.occurred_at                          AS recorded_at
FROM event_log r
WHERE r.event_type = 'CASE_REVIEWED';
