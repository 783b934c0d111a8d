-- casetrail schema, version 33: what people read is what was signed (docs/design.md,
-- "Served values").
--
-- 1. The log's columns that restate the signed bytes cannot differ from them. The
--    consumer stored `payload` and the envelope's columns beside `body` as it parsed
--    them; with the append-only trigger off for one transaction, the owner could rewrite
--    `payload` while `body` and `hash` stayed, and every SQL reader (react_cycles,
--    case_decisions, users' own queries) read the edit. A CHECK constraint now holds
--    every stored row's columns to its body: payload, event id, case, attempt, seq,
--    type, tenant, time, schema version, and the hash, SHA-256(prevHash LF body). A
--    constraint is not a trigger: switching triggers off (or replica mode) does not skip
--    it, on an INSERT or on an UPDATE; only dropping it does, which is DDL the audit sees.
--    NOT VALID: the rows already stored are not scanned (no lock held over the log, the
--    migration takes milliseconds at any size); every row inserted or changed from now
--    on is held to it. The rows before it are what `casetrail audit --full` and each
--    case's verification compare column by column, as before.
-- 2. `cases` takes its status, answer, outcome, totals and times from the inserted
--    events alone: the fold the consumer ran as its own UPDATE is now the owner's
--    trigger on event_log (the consumer loses UPDATE on cases, service/ops/setup.py), so
--    no component's database password rewrites the decision everyone is shown.
-- 3. The worker refuses a person's action only through the owner's
--    refuse_case_action(), which moves the row (never deletes it) and says so; the
--    worker loses DELETE on case_actions. case_actions_refused is append-only.

-- The body's envelope, as the columns restate it. IMMUTABLE: a body's bytes decide it
-- (the database's encoding is UTF-8, which setup makes it; occurredAt carries its
-- offset, so no session setting changes the instant it names).
CREATE FUNCTION event_log_restates_body(
    p_body bytea, p_payload jsonb, p_event_id uuid, p_case_id uuid, p_attempt integer,
    p_seq integer, p_event_type text, p_tenant_id text, p_occurred_at timestamptz,
    p_schema_version smallint, p_prev_hash text, p_hash text
) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e jsonb;
BEGIN
    IF p_body IS NULL OR p_prev_hash IS NULL OR p_hash IS NULL THEN
        RETURN false;
    END IF;
    e := convert_from(p_body, 'UTF8')::jsonb;
    RETURN jsonb_typeof(e) = 'object'
       AND e -> 'payload' = p_payload
       AND (e ->> 'eventId')::uuid = p_event_id
       AND (e ->> 'caseId')::uuid = p_case_id
       AND (e ->> 'attempt')::integer = p_attempt
       AND (e ->> 'seq')::integer = p_seq
       AND e ->> 'eventType' = p_event_type
       AND (e ->> 'tenantId') IS NOT DISTINCT FROM p_tenant_id
       AND (e ->> 'occurredAt')::timestamptz = p_occurred_at
       AND (e ->> 'schemaVersion')::smallint = p_schema_version
       AND encode(sha256(convert_to(p_prev_hash, 'UTF8') || '\x0a'::bytea || p_body), 'hex')
           = p_hash;
END;
$$;

ALTER TABLE event_log ADD CONSTRAINT event_log_restates_body CHECK (event_log_restates_body(
    body, payload, event_id, case_id, attempt, seq, event_type, tenant_id, occurred_at,
    schema_version, prev_hash, hash)) NOT VALID;

-- The fold, as the owner's. Each statement's inserted rows (never a duplicate: ON
-- CONFLICT DO NOTHING leaves it out of the transition table) move their cases: the
-- totals count every new cycle; a terminal event ends the case for good (its status,
-- its answer or none, the rest of its payload as the outcome); otherwise the latest
-- event that says where the case is (at work: no answer yet; or waiting for a person,
-- with the agent's answer and checks) moves it, only when it is later than the one the
-- row took its state from (`folded_attempt`, `folded_seq`: batches may be folded out of
-- order), so the row is the same whatever the batches were. Administrative events
-- (erasure, expiry, holds) move nothing. casetrail.trail.projection is this rule in
-- Python: every read that shows a case's values recomputes them from the signed bytes. The rows are locked in case-id order
-- first, as every statement that changes several cases does: no two wait in a cycle.
CREATE FUNCTION event_log_folds_into_cases() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM 1 FROM cases WHERE case_id IN (SELECT DISTINCT case_id FROM stored)
        ORDER BY case_id FOR NO KEY UPDATE;
    WITH folded AS (
        SELECT case_id,
               count(*) FILTER (WHERE event_type = 'REACT_CYCLE') AS cycles,
               coalesce(sum((payload -> 'tokenUsage' ->> 'inputTokens')::bigint)
                        FILTER (WHERE event_type = 'REACT_CYCLE'), 0) AS input_tokens,
               coalesce(sum((payload -> 'tokenUsage' ->> 'outputTokens')::bigint)
                        FILTER (WHERE event_type = 'REACT_CYCLE'), 0) AS output_tokens,
               min(occurred_at) FILTER (WHERE event_type = 'CASE_STARTED') AS started_at,
               (array_agg(event_type ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_CANCELLED', 'CASE_COMPLETED', 'CASE_FAILED',
                                         'CASE_TIMED_OUT')))[1] AS terminal_type,
               (array_agg(payload ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_CANCELLED', 'CASE_COMPLETED', 'CASE_FAILED',
                                         'CASE_TIMED_OUT')))[1] AS terminal_payload,
               (array_agg(occurred_at ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_CANCELLED', 'CASE_COMPLETED', 'CASE_FAILED',
                                         'CASE_TIMED_OUT')))[1] AS terminal_at,
               (array_agg(event_type ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_STARTED', 'REACT_CYCLE', 'CASE_REVIEWED',
                                         'CASE_AWAITING_REVIEW')))[1] AS mark_type,
               (array_agg(payload ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_STARTED', 'REACT_CYCLE', 'CASE_REVIEWED',
                                         'CASE_AWAITING_REVIEW')))[1] AS mark_payload,
               (array_agg(attempt ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_STARTED', 'REACT_CYCLE', 'CASE_REVIEWED',
                                         'CASE_AWAITING_REVIEW')))[1] AS mark_attempt,
               (array_agg(seq ORDER BY attempt DESC, seq DESC) FILTER (
                    WHERE event_type IN ('CASE_STARTED', 'REACT_CYCLE', 'CASE_REVIEWED',
                                         'CASE_AWAITING_REVIEW')))[1] AS mark_seq
        FROM stored
        GROUP BY case_id
    ), placed AS (
        SELECT f.*, c.status AS was, c.answer AS was_answer, c.outcome AS was_outcome,
               c.status IN ('cancelled', 'completed', 'failed', 'timed_out') AS ended,
               f.mark_type IS NOT NULL AND (c.folded_attempt IS NULL
                   OR (f.mark_attempt, f.mark_seq) > (c.folded_attempt, c.folded_seq))
                   AS later
        FROM folded f JOIN cases c USING (case_id)
    )
    UPDATE cases c SET
        cycles = c.cycles + p.cycles,
        input_tokens = c.input_tokens + p.input_tokens,
        output_tokens = c.output_tokens + p.output_tokens,
        status = CASE
            WHEN p.ended THEN p.was
            WHEN p.terminal_type IS NOT NULL THEN lower(substr(p.terminal_type, 6))
            WHEN NOT p.later THEN p.was
            WHEN p.mark_type = 'CASE_AWAITING_REVIEW' THEN 'awaiting_review'
            ELSE 'running' END,
        -- A case waiting for a person shows the agent's answer and checks; its terminal
        -- event's replace them (the reviewed decision).
        answer = CASE
            WHEN p.ended THEN p.was_answer
            WHEN p.terminal_type = 'CASE_COMPLETED' THEN p.terminal_payload -> 'answer'
            WHEN p.terminal_type IS NOT NULL THEN NULL
            WHEN NOT p.later THEN p.was_answer
            WHEN p.mark_type = 'CASE_AWAITING_REVIEW' THEN p.mark_payload -> 'answer'
            ELSE NULL END,
        outcome = CASE
            WHEN p.ended THEN p.was_outcome
            WHEN p.terminal_type IS NOT NULL THEN p.terminal_payload - 'answer'
            WHEN NOT p.later THEN p.was_outcome
            WHEN p.mark_type = 'CASE_AWAITING_REVIEW' THEN p.mark_payload - 'answer'
            ELSE NULL END,
        folded_attempt = CASE WHEN p.later THEN p.mark_attempt ELSE c.folded_attempt END,
        folded_seq = CASE WHEN p.later THEN p.mark_seq ELSE c.folded_seq END,
        started_at = coalesce(c.started_at, p.started_at),
        ended_at = CASE WHEN c.ended_at IS NULL AND NOT p.ended AND p.terminal_type IS NOT NULL
                        THEN p.terminal_at ELSE c.ended_at END,
        updated_at = now()
    FROM placed p
    WHERE c.case_id = p.case_id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER event_log_folds_into_cases AFTER INSERT ON event_log
    REFERENCING NEW TABLE AS stored FOR EACH STATEMENT
    EXECUTE FUNCTION event_log_folds_into_cases();
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_folds_into_cases;

-- A person's action the worker will not act on leaves the wait's way, kept: moved to
-- case_actions_refused with the worker's reason, in one statement of the owner's. The
-- audit checks each refusal again (`refused_valid_action`).
CREATE FUNCTION refuse_case_action(p_case uuid, p_attempt integer, p_why text, p_code text)
    RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    moved integer;
BEGIN
    IF p_why IS NULL OR length(p_why) NOT BETWEEN 1 AND 2000
       OR p_code IS NULL OR p_code !~ '^[a-z_]{1,64}$' THEN
        RAISE EXCEPTION 'a refusal says why (1 to 2000 characters) and its code '
            '(lower-case words joined by _)' USING ERRCODE = 'check_violation';
    END IF;
    WITH gone AS (DELETE FROM case_actions WHERE case_id = p_case
                  AND parked_attempt = p_attempt RETURNING *),
         kept AS (INSERT INTO case_actions_refused (case_id, parked_attempt, kind, verdict,
                      reason, decision, reviewer, acted_at, signed, key_id, sig, why,
                      why_code)
                  SELECT case_id, parked_attempt, kind, verdict, reason, decision, reviewer,
                         acted_at, signed, key_id, sig, p_why, p_code FROM gone
                  RETURNING 1)
    SELECT count(*) INTO moved FROM kept;
    RETURN moved > 0;
END;
$$;
REVOKE EXECUTE ON FUNCTION refuse_case_action(uuid, integer, text, text) FROM PUBLIC;

CREATE TRIGGER case_actions_refused_append_only BEFORE UPDATE OR DELETE ON case_actions_refused
    FOR EACH ROW EXECUTE FUNCTION append_only();
CREATE TRIGGER case_actions_refused_no_truncate BEFORE TRUNCATE ON case_actions_refused
    FOR EACH STATEMENT EXECUTE FUNCTION append_only();
ALTER TABLE case_actions_refused ENABLE ALWAYS TRIGGER case_actions_refused_append_only;
ALTER TABLE case_actions_refused ENABLE ALWAYS TRIGGER case_actions_refused_no_truncate;
