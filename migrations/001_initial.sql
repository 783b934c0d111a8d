-- casetrail schema, version 1: the event log, the cases it describes, and views for auditors.

-- One row per case. `status` and the totals are kept current by the event-log
-- consumer in the same transaction that stores the events; the lease columns
-- belong to the workers (who is running which attempt).
CREATE TABLE cases (
    case_id              uuid PRIMARY KEY,
    agent                text        NOT NULL,
    status               text        NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'completed', 'failed', 'timed_out', 'cancelled')),
    input                jsonb       NOT NULL,
    model                jsonb       NOT NULL,
    limits               jsonb       NOT NULL,
    idempotency_key      text        UNIQUE,
    request_digest       text        NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    ended_at             timestamptz,
    cycles               integer     NOT NULL DEFAULT 0,
    input_tokens         bigint      NOT NULL DEFAULT 0,
    output_tokens        bigint      NOT NULL DEFAULT 0,
    answer               jsonb,
    outcome              jsonb,
    -- worker coordination: attempts claimed so far, the live claim, requests to stop
    attempts_claimed     integer     NOT NULL DEFAULT 0,
    lease_owner          text,
    lease_expires_at     timestamptz,
    cancel_requested_at  timestamptz,
    cancel_reason        text,
    terminal_published   boolean     NOT NULL DEFAULT false
);

CREATE INDEX cases_status ON cases (status, created_at);

-- The append-only event log: one row per event, exactly as published.
CREATE TABLE event_log (
    event_id        uuid        PRIMARY KEY,
    case_id         uuid        NOT NULL,
    attempt         integer     NOT NULL CHECK (attempt >= 1),
    seq             integer     NOT NULL CHECK (seq >= 0),
    event_type      text        NOT NULL CHECK (event_type IN (
        'CASE_STARTED', 'REACT_CYCLE', 'CASE_COMPLETED', 'CASE_FAILED',
        'CASE_TIMED_OUT', 'CASE_CANCELLED')),
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    schema_version  smallint    NOT NULL,
    payload         jsonb       NOT NULL,
    -- Serves the auditor's query straight from the index:
    --   WHERE case_id = $1 AND event_type = ANY($2) ORDER BY attempt, seq
    CONSTRAINT event_log_case_attempt_seq UNIQUE (case_id, attempt, seq) INCLUDE (event_type)
);

-- Evidence is never edited: refuse UPDATE, DELETE and TRUNCATE on the log.
CREATE FUNCTION event_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'event_log is append-only (% refused)', TG_OP;
END;
$$;
CREATE TRIGGER event_log_no_update_or_delete
    BEFORE UPDATE OR DELETE ON event_log
    FOR EACH ROW EXECUTE FUNCTION event_log_append_only();
CREATE TRIGGER event_log_no_truncate
    BEFORE TRUNCATE ON event_log
    FOR EACH STATEMENT EXECUTE FUNCTION event_log_append_only();

-- One row per ReAct cycle.
CREATE VIEW react_cycles AS
SELECT e.case_id,
       e.attempt,
       e.seq,
       e.event_id,
       e.occurred_at,
       (e.payload ->> 'cycleIndex')::int                       AS cycle_index,
       e.payload ->> 'reasoningText'                           AS reasoning_text,
       (e.payload -> 'tokenUsage' ->> 'inputTokens')::int      AS input_tokens,
       (e.payload -> 'tokenUsage' ->> 'outputTokens')::int     AS output_tokens,
       jsonb_array_length(e.payload -> 'toolCalls')            AS tool_call_count,
       e.payload ->> 'model'                                   AS model,
       e.payload ->> 'finishReason'                            AS finish_reason
FROM event_log e
WHERE e.event_type = 'REACT_CYCLE';

-- One row per tool call, in the order the model asked for them.
CREATE VIEW react_tool_calls AS
SELECT e.case_id,
       e.attempt,
       e.seq,
       (e.payload ->> 'cycleIndex')::int                       AS cycle_index,
       (t.ordinal - 1)::int                                    AS call_index,
       t.call ->> 'toolName'                                   AS tool_name,
       t.call -> 'toolArgs'                                    AS tool_args,
       t.call -> 'toolResult'                                  AS tool_result,
       t.call ->> 'toolSource'                                 AS tool_source,
       (t.call ->> 'durationMs')::int                          AS duration_ms,
       t.call ->> 'error'                                      AS error,
       coalesce(jsonb_array_length(t.call -> 'attempts'), 0)   AS attempt_count,
       e.occurred_at
FROM event_log e
CROSS JOIN LATERAL jsonb_array_elements(e.payload -> 'toolCalls') WITH ORDINALITY AS t(call, ordinal)
WHERE e.event_type = 'REACT_CYCLE';
