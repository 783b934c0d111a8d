--
-- PostgreSQL database dump
--

--
-- Name: append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END;
$$;

--
-- Name: audit_run_chains(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.audit_run_chains() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    last audit_runs;
BEGIN
    IF NEW.body IS NULL THEN
        RAISE EXCEPTION 'an audit run is kept signed (schema 37)' USING ERRCODE = 'CTARS';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('casetrail.audit_runs'));
    SELECT * INTO last FROM audit_runs WHERE chain_seq IS NOT NULL
        ORDER BY chain_seq DESC LIMIT 1;
    IF NEW.chain_seq <> COALESCE(last.chain_seq + 1, 0)
       OR NEW.prev_hash <> COALESCE(last.hash, repeat('0', 64)) THEN
        RAISE EXCEPTION 'an audit run must follow the last one (seq %, hash %)',
            COALESCE(last.chain_seq + 1, 0), COALESCE(last.hash, repeat('0', 64))
            USING ERRCODE = 'CTARC';
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: backtest_record_chains(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.backtest_record_chains() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    last backtest_records;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('casetrail.backtest_records'));
    SELECT * INTO last FROM backtest_records ORDER BY chain_seq DESC LIMIT 1;
    IF NEW.chain_seq <> COALESCE(last.chain_seq + 1, 0)
       OR NEW.prev_hash <> COALESCE(last.hash, repeat('0', 64)) THEN
        RAISE EXCEPTION 'a backtest record must follow the last one (seq %, hash %)',
            COALESCE(last.chain_seq + 1, 0), COALESCE(last.hash, repeat('0', 64))
            USING ERRCODE = 'CTBTC';
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: backtest_record_enters_ledger(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.backtest_record_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash, kind)
    VALUES (NEW.backtest_id, NEW.backtest_id, NEW.hash, 'backtest');
    RETURN NULL;
END;
$$;

--
-- Name: case_held(uuid, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.case_held(p_case uuid, p_tenant text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM legal_holds h
        WHERE h.tenant_id = p_tenant
          AND (h.ends_at IS NULL OR h.ends_at > now())
          AND (SELECT count(*) FROM legal_hold_releases r WHERE r.hold_id = h.hold_id) < 2
          AND (h.scope = 'tenant'
               OR (h.scope = 'case' AND h.case_id = p_case)
               OR (h.scope = 'business_key' AND (
                       EXISTS (SELECT 1 FROM case_keys k WHERE k.case_id = p_case
                               AND k.field = h.key_field AND k.value = h.key_value)
                       OR EXISTS (SELECT 1 FROM case_key_marks m WHERE m.case_id = p_case
                                  AND m.field = h.key_field AND m.digest = h.key_value)))))
$$;

--
-- Name: case_keys_marked(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.case_keys_marked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO case_key_marks (case_id, tenant_id, field, digest)
    VALUES (OLD.case_id, OLD.tenant_id, OLD.field, OLD.value) ON CONFLICT DO NOTHING;
    RETURN OLD;
END;
$$;

--
-- Name: case_keys_with_their_case(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.case_keys_with_their_case() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM cases c
                   WHERE c.case_id = NEW.case_id AND c.tenant_id = NEW.tenant_id
                     AND c.xmin = pg_current_xact_id()::xid
                     AND c.input ? NEW.field
                     AND (NEW.digest OR jsonb_typeof(c.input -> NEW.field) <> 'string'
                          OR left(c.input ->> NEW.field, 300) = NEW.value)) THEN
        RAISE EXCEPTION 'a business key is kept only with the case it names: made in the '
            'same transaction, in its tenant, the value its input holds (case %, field %)',
            NEW.case_id, NEW.field USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

--
-- Name: case_secrets_not_held(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.case_secrets_not_held() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF NEW.erased_at IS NOT NULL AND OLD.erased_at IS NULL AND case_held(
            OLD.case_id, (SELECT tenant_id FROM cases WHERE case_id = OLD.case_id)) THEN
        RAISE EXCEPTION 'case % is under a legal hold: its values are not erased',
            OLD.case_id USING ERRCODE = 'CTHLD';
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: cases_kept(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.cases_kept() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = OLD.case_id
                   AND e.event_type <> 'CASE_EXPIRED') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'case % has a trail: it goes only with its expiry', OLD.case_id;
END;
$$;

--
-- Name: erase_for_retention(uuid, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.erase_for_retention(p_case uuid, p_by text) RETURNS timestamp with time zone
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT erase_personal_data(p_case, p_by)
$$;

--
-- Name: erase_personal_data(uuid, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.erase_personal_data(p_case uuid, p_by text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    erased timestamptz;
BEGIN
    IF p_by IS NULL OR length(p_by) NOT BETWEEN 1 AND 300 THEN
        RAISE EXCEPTION 'an erasure names who erased (1 to 300 characters)'
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE case_secrets SET wrapped_key = NULL, ciphertext = NULL, erased_at = now(),
                            erased_by = p_by
    WHERE case_id = p_case AND erased_at IS NULL RETURNING erased_at INTO erased;
    IF erased IS NOT NULL THEN
        DELETE FROM case_keys WHERE case_id = p_case AND digest;
    END IF;
    RETURN erased;
END;
$$;

--
-- Name: event_log_append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_append_only() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (
            SELECT 1 FROM case_tombstones t WHERE t.case_id = OLD.case_id
            AND t.event_id <> OLD.event_id)
       AND NOT case_held(OLD.case_id, OLD.tenant_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'event_log is append-only (% refused)', TG_OP;
END;
$$;

--
-- Name: event_log_drop_expired_partitions(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_drop_expired_partitions() RETURNS text[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $_$
DECLARE
    part record;
    blocked boolean;
    dropped text[] := '{}';
    floor_days integer;
BEGIN
    SELECT min_days INTO floor_days FROM retention_floor;
    PERFORM pg_advisory_xact_lock(hashtext('casetrail.event_log partitions'));
    FOR part IN
        SELECT c.oid::regclass AS rel, c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'event_log'::regclass AND c.relname ~ '^event_log_[0-9]{4}_[0-9]{2}$'
          AND to_timestamp(substr(c.relname, 11), 'YYYY_MM') + interval '1 month'
              + make_interval(days => floor_days) < now()
        ORDER BY c.relname
    LOOP
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM %s e WHERE e.event_type <> ''CASE_EXPIRED'' '
            'OR NOT EXISTS (SELECT 1 FROM case_tombstones t WHERE t.case_id = e.case_id '
            'AND t.event_id = e.event_id) OR EXISTS (SELECT 1 FROM cases c '
            'WHERE c.case_id = e.case_id) OR case_held(e.case_id, e.tenant_id))', part.rel)
            INTO blocked;
        CONTINUE WHEN blocked;
        EXECUTE format('ALTER TABLE event_log DETACH PARTITION %s', part.rel);
        EXECUTE format(
            'INSERT INTO event_log_default (event_id, case_id, attempt, seq, event_type, '
            'occurred_at, recorded_at, schema_version, payload, tenant_id, prev_hash, hash, '
            'key_id, sig, body) SELECT event_id, case_id, attempt, seq, event_type, '
            'occurred_at, recorded_at, schema_version, payload, tenant_id, prev_hash, hash, '
            'key_id, sig, body FROM %s', part.rel);
        EXECUTE format('DROP TABLE %s', part.rel);
        dropped := dropped || part.relname::text;
    END LOOP;
    RETURN dropped;
END;
$_$;

--
-- Name: event_log_enters_ledger(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash)
    SELECT event_id, case_id, hash FROM stored WHERE hash IS NOT NULL
    ORDER BY case_id, attempt, seq;
    -- The administrative events of retention and holds are rare: one look at the batch.
    IF EXISTS (SELECT 1 FROM stored WHERE event_type IN ('CASE_EXPIRED', 'CASE_HELD',
                                                         'CASE_RELEASED')) THEN
        INSERT INTO case_tombstones (case_id, tenant_id, event_id, event_hash, policy_id,
                                     policy_version, events_removed, heads, expired_by,
                                     expired_at, archive)
        SELECT case_id, tenant_id, event_id, hash, (payload ->> 'policyId')::bigint,
               (payload ->> 'policyVersion')::int, (payload ->> 'eventsRemoved')::int,
               payload -> 'heads', payload ->> 'expiredBy', occurred_at,
               payload -> 'archive'
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

--
-- Name: event_log_erases_values(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_erases_values() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM stored WHERE event_type = 'CASE_ERASED') THEN
        RETURN NULL;
    END IF;
    WITH erased AS (
        UPDATE case_secrets s
        SET wrapped_key = NULL, ciphertext = NULL,
            erased_at = (e.payload ->> 'erasedAt')::timestamptz,
            erased_by = left(e.payload ->> 'erasedBy', 300)
        FROM stored e
        WHERE e.event_type = 'CASE_ERASED' AND s.case_id = e.case_id
          AND s.erased_at IS NULL AND NOT case_held(e.case_id, e.tenant_id)
        RETURNING s.case_id
    )
    DELETE FROM case_keys k USING erased WHERE k.case_id = erased.case_id AND k.digest;
    RETURN NULL;
END;
$$;

--
-- Name: event_log_folds_into_cases(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_folds_into_cases() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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

--
-- Name: event_log_make_partition(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_make_partition(month timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $_$
DECLARE
    name text;
    lo uuid;
    hi uuid;
BEGIN
    month := date_trunc('month', month, 'UTC');
    name := 'event_log_' || to_char(month AT TIME ZONE 'UTC', 'YYYY_MM');
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- One maker at a time; look again once it is ours.
    PERFORM pg_advisory_xact_lock(hashtext('casetrail.event_log partitions'));
    lo := uuid7_floor(month);
    hi := uuid7_floor(month + interval '1 month');
    IF to_regclass(name) IS NOT NULL OR EXISTS (
            SELECT 1 FROM event_log_default WHERE case_id >= lo AND case_id < hi) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF event_log FOR VALUES FROM (%L) TO (%L)',
                   name, lo, hi);
    -- Serves the auditor's query straight from the index:
    --   WHERE case_id = $1 AND event_type = ANY($2) ORDER BY attempt, seq
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I UNIQUE (case_id, attempt, seq) '
                   'INCLUDE (event_type), ADD CONSTRAINT %I UNIQUE (case_id, event_id)',
                   name, name || '_case_attempt_seq', name || '_case_event');
    EXECUTE format('CREATE TRIGGER event_log_no_truncate BEFORE TRUNCATE ON %I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION event_log_append_only()', name);
    EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER event_log_no_truncate', name);
    RETURN true;
END;
$_$;

--
-- Name: event_log_prepare_partitions(integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_prepare_partitions(months_ahead integer DEFAULT 24) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    made integer := 0;
BEGIN
    IF months_ahead NOT BETWEEN 0 AND 240 THEN
        RAISE EXCEPTION 'months_ahead is 0 to 240; % asked', months_ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN -1 .. months_ahead LOOP
        IF event_log_make_partition(now() + make_interval(months => i)) THEN
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END;
$$;

--
-- Name: event_log_restates_body(bytea, jsonb, uuid, uuid, integer, integer, text, text, timestamp with time zone, smallint, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_log_restates_body(p_body bytea, p_payload jsonb, p_event_id uuid, p_case_id uuid, p_attempt integer, p_seq integer, p_event_type text, p_tenant_id text, p_occurred_at timestamp with time zone, p_schema_version smallint, p_prev_hash text, p_hash text) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: expire_case(uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.expire_case(p_case uuid) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    stone case_tombstones;
    removed integer;
BEGIN
    SELECT * INTO stone FROM case_tombstones WHERE case_id = p_case;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'case % has no tombstone: nothing of it is deleted', p_case
            USING ERRCODE = 'CTTMB';
    END IF;
    IF case_held(p_case, stone.tenant_id) THEN
        RAISE EXCEPTION 'case % is under a legal hold: it does not expire', p_case
            USING ERRCODE = 'CTHLD';
    END IF;
    IF stone.archive IS NULL AND EXISTS (SELECT 1 FROM retention_policies p
                                         WHERE p.policy_id = stone.policy_id AND p.archive) THEN
        RAISE EXCEPTION 'case % is archived before it expires, and its CASE_EXPIRED names '
            'no archive: nothing of it is deleted', p_case USING ERRCODE = 'CTARC';
    END IF;
    IF EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = p_case AND NOT EXISTS (
                   SELECT 1 FROM ledger_leaves l WHERE l.event_id = e.event_id)) THEN
        RAISE EXCEPTION 'case % has events the log has not taken yet', p_case
            USING ERRCODE = 'CTLOG';
    END IF;
    DELETE FROM event_log WHERE case_id = p_case AND event_id <> stone.event_id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM cases WHERE case_id = p_case;
    RETURN removed;
END;
$$;

--
-- Name: journal_missing(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.journal_missing(p_entries jsonb) RETURNS SETOF integer
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT (j.ordinality - 1)::int
    FROM jsonb_array_elements(p_entries) WITH ORDINALITY AS j(e, ordinality)
    WHERE NOT CASE j.e ->> 'kind'
        WHEN 'policy' THEN EXISTS (
            SELECT 1 FROM retention_policies p WHERE p.tenant_id = j.e ->> 'tenantId'
            AND p.agent = j.e ->> 'agent' AND p.version = (j.e ->> 'version')::int)
        WHEN 'approval' THEN EXISTS (
            SELECT 1 FROM retention_approvals a JOIN retention_policies p USING (policy_id)
            WHERE p.tenant_id = j.e ->> 'tenantId' AND p.agent = j.e ->> 'agent'
            AND p.version = (j.e ->> 'version')::int)
        WHEN 'businessDate' THEN EXISTS (
            SELECT 1 FROM retention_business_dates d WHERE d.tenant_id = j.e ->> 'tenantId'
            AND d.field = j.e ->> 'field' AND d.value = j.e ->> 'value'
            AND d.set_at = (j.e ->> 'setAt')::timestamptz)
        WHEN 'hold' THEN EXISTS (
            SELECT 1 FROM legal_holds h WHERE h.hold_id = (j.e ->> 'holdId')::uuid)
        WHEN 'release' THEN EXISTS (
            SELECT 1 FROM legal_hold_releases r WHERE r.hold_id = (j.e ->> 'holdId')::uuid
            AND r.person = j.e ->> 'person')
        WHEN 'erasure' THEN NOT EXISTS (
            SELECT 1 FROM case_secrets s WHERE s.case_id = (j.e ->> 'caseId')::uuid
            AND s.erased_at IS NULL) OR case_held((j.e ->> 'caseId')::uuid, j.e ->> 'tenantId')
        ELSE false END
$$;

--
-- Name: ledger_append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.ledger_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END;
$$;

--
-- Name: ledger_tile_only_grows(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.ledger_tile_only_grows() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF length(NEW.hashes) < length(OLD.hashes)
       OR substring(NEW.hashes FROM 1 FOR length(OLD.hashes)) <> OLD.hashes
       OR NEW.level <> OLD.level OR NEW.tile_index <> OLD.tile_index THEN
        RAISE EXCEPTION 'tile %/% may only grow', OLD.level, OLD.tile_index;
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: reader_tenant(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.reader_tenant() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$ SELECT tenant_id FROM public.tenant_readers WHERE role_name = session_user $$;

--
-- Name: refuse_case_action(uuid, integer, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.refuse_case_action(p_case uuid, p_attempt integer, p_why text, p_code text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $_$
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
$_$;

--
-- Name: retention_approval_checked(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.retention_approval_checked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM retention_policies p WHERE p.policy_id = NEW.policy_id
               AND p.set_by = NEW.approved_by) THEN
        RAISE EXCEPTION 'the person who set a policy does not approve it (two persons)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: retention_policy_checked(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.retention_policy_checked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    floor_days integer;
    current retention_policies;
BEGIN
    SELECT min_days INTO floor_days FROM retention_floor;
    IF NEW.keep_days IS NOT NULL AND NEW.keep_days < floor_days THEN
        RAISE EXCEPTION 'a policy keeps cases at least % days (the floor); % asked',
            floor_days, NEW.keep_days USING ERRCODE = 'check_violation';
    END IF;
    SELECT * INTO current FROM retention_in_force
        WHERE tenant_id = NEW.tenant_id AND agent = NEW.agent;
    -- Keeping less than before, deleting where everything was kept, or no longer
    -- archiving what was archived: two persons.
    NEW.needs_second := (NEW.keep_days IS NOT NULL
                         AND (current.policy_id IS NULL OR current.keep_days IS NULL
                              OR NEW.keep_days < current.keep_days))
                     OR (NEW.personal_data_days IS NOT NULL
                         AND (current.policy_id IS NULL OR current.personal_data_days IS NULL
                              OR NEW.personal_data_days < current.personal_data_days))
                     OR (current.policy_id IS NOT NULL
                         AND NEW.counted_from IS DISTINCT FROM current.counted_from)
                     OR (current.policy_id IS NOT NULL AND current.archive
                         AND NOT NEW.archive);
    RETURN NEW;
END;
$$;

--
-- Name: uuid7_floor(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.uuid7_floor(at timestamp with time zone) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid
$$;

--
-- Name: withdraw_case(uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.withdraw_case(p_case uuid) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    WITH gone AS (DELETE FROM cases WHERE case_id = p_case AND attempts_claimed = 0
                  RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

--
-- Name: access_log; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.access_log (
    access_id uuid DEFAULT gen_random_uuid() NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    principal text NOT NULL,
    tenant_id text NOT NULL,
    case_id uuid NOT NULL,
    action text NOT NULL,
    CONSTRAINT access_log_action_check CHECK ((action = ANY (ARRAY['pii:read'::text, 'export'::text, 'erase'::text])))
);

--
-- Name: action_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.action_keys (
    key_id text NOT NULL,
    public_key bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    not_valid_after timestamp with time zone,
    CONSTRAINT action_keys_check CHECK (((retired_at IS NULL) = (not_valid_after IS NULL))),
    CONSTRAINT action_keys_key_id_check CHECK ((key_id ~ '^[0-9a-f]{16}$'::text)),
    CONSTRAINT action_keys_public_key_check CHECK ((length(public_key) = 32))
);

--
-- Name: api_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_keys (
    key_id text NOT NULL,
    key_hash text NOT NULL,
    tenant_id text NOT NULL,
    scopes text[] NOT NULL,
    name text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    person text,
    CONSTRAINT api_keys_key_hash_check CHECK ((key_hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT api_keys_key_id_check CHECK ((key_id ~ '^[0-9a-f]{12}$'::text)),
    CONSTRAINT api_keys_person_check CHECK (((person IS NULL) OR (person ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$'::text))),
    CONSTRAINT api_keys_tenant_id_check CHECK ((tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'::text))
);

--
-- Name: audit_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.audit_keys (
    key_id text NOT NULL,
    public_key bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    not_valid_after timestamp with time zone,
    CONSTRAINT audit_keys_check CHECK (((retired_at IS NULL) = (not_valid_after IS NULL))),
    CONSTRAINT audit_keys_key_id_check CHECK ((key_id ~ '^[0-9a-f]{16}$'::text)),
    CONSTRAINT audit_keys_public_key_check CHECK ((length(public_key) = 32))
);

--
-- Name: audit_runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.audit_runs (
    run_id bigint NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    full_pass boolean NOT NULL,
    from_leaf bigint NOT NULL,
    to_leaf bigint NOT NULL,
    cases_checked integer NOT NULL,
    findings jsonb NOT NULL,
    scrubbed_to uuid,
    cases_scrubbed integer DEFAULT 0 NOT NULL,
    scrub_lapped boolean DEFAULT false NOT NULL,
    chain_seq bigint,
    body bytea,
    prev_hash text,
    hash text,
    key_id text,
    sig text,
    CONSTRAINT audit_runs_cases_scrubbed_check CHECK ((cases_scrubbed >= 0)),
    CONSTRAINT audit_runs_chain_seq_check CHECK ((chain_seq >= 0)),
    CONSTRAINT audit_runs_check CHECK ((to_leaf >= from_leaf)),
    CONSTRAINT audit_runs_from_leaf_check CHECK ((from_leaf >= 0)),
    CONSTRAINT audit_runs_hash_check CHECK ((hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT audit_runs_prev_hash_check CHECK ((prev_hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT audit_runs_signed CHECK ((((body IS NULL) = (chain_seq IS NULL)) AND ((body IS NULL) = (prev_hash IS NULL)) AND ((body IS NULL) = (hash IS NULL)) AND ((body IS NULL) = (key_id IS NULL)) AND ((body IS NULL) = (sig IS NULL))))
);

--
-- Name: audit_runs_run_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.audit_runs ALTER COLUMN run_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.audit_runs_run_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: backtest_records; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.backtest_records (
    backtest_id uuid NOT NULL,
    chain_seq bigint NOT NULL,
    body bytea NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    key_id text NOT NULL,
    sig text NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT backtest_records_chain_seq_check CHECK ((chain_seq >= 0)),
    CONSTRAINT backtest_records_hash_check CHECK ((hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT backtest_records_prev_hash_check CHECK ((prev_hash ~ '^[0-9a-f]{64}$'::text))
);

--
-- Name: backtest_results; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.backtest_results (
    backtest_id uuid NOT NULL,
    "position" integer NOT NULL,
    case_id uuid NOT NULL,
    result jsonb NOT NULL,
    digest text NOT NULL,
    CONSTRAINT backtest_results_digest_check CHECK ((digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT backtest_results_position_check CHECK (("position" >= 0))
);

--
-- Name: backtests; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.backtests (
    backtest_id uuid NOT NULL,
    tenant_id text,
    agent text NOT NULL,
    request jsonb NOT NULL,
    requested_by text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    status text DEFAULT 'queued'::text NOT NULL,
    runner text,
    lease_expires_at timestamp with time zone,
    started_at timestamp with time zone,
    cases_done integer DEFAULT 0 NOT NULL,
    cases_selected integer,
    problem text,
    finished_at timestamp with time zone,
    CONSTRAINT backtests_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'running'::text, 'done'::text, 'failed'::text])))
);

--
-- Name: capability_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.capability_keys (
    capability text NOT NULL,
    public_key bytea NOT NULL,
    registered_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT capability_keys_capability_check CHECK ((capability ~ '^[a-z0-9][a-z0-9-]{0,62}$'::text)),
    CONSTRAINT capability_keys_public_key_check CHECK ((length(public_key) = 32))
);

--
-- Name: case_actions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_actions (
    case_id uuid NOT NULL,
    parked_attempt integer NOT NULL,
    kind text NOT NULL,
    verdict text,
    reason text,
    decision jsonb,
    reviewer jsonb,
    acted_at timestamp with time zone DEFAULT now() NOT NULL,
    signed jsonb,
    key_id text,
    sig text,
    CONSTRAINT case_actions_check CHECK (((kind = 'review'::text) = ((verdict IS NOT NULL) AND (reviewer IS NOT NULL) AND (reason IS NOT NULL)))),
    CONSTRAINT case_actions_check1 CHECK (((verdict = 'override'::text) = (decision IS NOT NULL))),
    CONSTRAINT case_actions_kind_check CHECK ((kind = ANY (ARRAY['review'::text, 'answer'::text, 'cancel'::text]))),
    CONSTRAINT case_actions_parked_attempt_check CHECK ((parked_attempt >= 1)),
    CONSTRAINT case_actions_verdict_check CHECK ((verdict = ANY (ARRAY['confirm'::text, 'override'::text, 'return'::text])))
);

--
-- Name: case_actions_refused; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_actions_refused (
    refusal_id bigint NOT NULL,
    case_id uuid NOT NULL,
    parked_attempt integer NOT NULL,
    kind text NOT NULL,
    verdict text,
    reason text,
    decision jsonb,
    reviewer jsonb,
    acted_at timestamp with time zone NOT NULL,
    signed jsonb,
    key_id text,
    sig text,
    refused_at timestamp with time zone DEFAULT now() NOT NULL,
    why text NOT NULL,
    why_code text NOT NULL
);

--
-- Name: case_actions_refused_refusal_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.case_actions_refused ALTER COLUMN refusal_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.case_actions_refused_refusal_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: event_log; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.event_log (
    event_id uuid NOT NULL,
    case_id uuid NOT NULL,
    attempt integer NOT NULL,
    seq integer NOT NULL,
    event_type text NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    schema_version smallint NOT NULL,
    payload jsonb NOT NULL,
    tenant_id text DEFAULT 'default'::text NOT NULL,
    prev_hash text,
    hash text,
    key_id text,
    sig text,
    body bytea,
    CONSTRAINT event_log_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT event_log_event_type_check CHECK ((event_type = ANY (ARRAY['CASE_STARTED'::text, 'REACT_CYCLE'::text, 'CASE_COMPLETED'::text, 'CASE_FAILED'::text, 'CASE_TIMED_OUT'::text, 'CASE_CANCELLED'::text, 'CASE_ERASED'::text, 'CASE_AWAITING_REVIEW'::text, 'CASE_REVIEWED'::text, 'CASE_EXPIRED'::text, 'CASE_HELD'::text, 'CASE_RELEASED'::text]))),
    CONSTRAINT event_log_seq_check CHECK ((seq >= 0)),
    CONSTRAINT event_log_signed_from_version_2 CHECK (((schema_version < 2) OR ((prev_hash IS NOT NULL) AND (hash IS NOT NULL) AND (key_id IS NOT NULL) AND (sig IS NOT NULL) AND (body IS NOT NULL))))
)
PARTITION BY RANGE (case_id);

--
-- Name: case_decisions; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.case_decisions WITH (security_invoker='true') AS
 SELECT t.case_id,
    t.tenant_id,
    (s.payload ->> 'agent'::text) AS agent,
    (s.payload ->> 'agentVersion'::text) AS agent_version,
    t.event_type AS terminal_event,
    ((t.payload -> 'answer'::text) ->> 'decision'::text) AS decision,
        CASE
            WHEN (t.payload ? 'answer'::text) THEN COALESCE((t.payload ->> 'decidedBy'::text), 'agent'::text)
            ELSE NULL::text
        END AS decided_by,
    (t.payload ->> 'reasonCode'::text) AS reason_code,
    (( SELECT count(*) AS count
           FROM jsonb_array_elements(COALESCE((t.payload -> 'checks'::text), '[]'::jsonb)) c(check_result)
          WHERE ((c.check_result ->> 'passed'::text))::boolean))::integer AS checks_passed,
    (( SELECT count(*) AS count
           FROM jsonb_array_elements(COALESCE((t.payload -> 'checks'::text), '[]'::jsonb)) c(check_result)
          WHERE (NOT ((c.check_result ->> 'passed'::text))::boolean)))::integer AS checks_failed,
    ARRAY( SELECT (c.check_result ->> 'name'::text)
           FROM jsonb_array_elements(COALESCE((t.payload -> 'checks'::text), '[]'::jsonb)) c(check_result)
          WHERE (NOT ((c.check_result ->> 'passed'::text))::boolean)) AS failed_checks,
    ((s.payload -> 'model'::text) ->> 'provider'::text) AS model_provider,
    ((s.payload -> 'model'::text) ->> 'name'::text) AS model_name,
    t.occurred_at AS ended_at
   FROM (public.event_log t
     JOIN public.event_log s ON (((s.case_id = t.case_id) AND (s.attempt = t.attempt) AND (s.seq = 0))))
  WHERE (t.event_type = ANY (ARRAY['CASE_COMPLETED'::text, 'CASE_FAILED'::text, 'CASE_TIMED_OUT'::text, 'CASE_CANCELLED'::text]));

--
-- Name: case_key_marks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_key_marks (
    case_id uuid NOT NULL,
    tenant_id text NOT NULL,
    field text NOT NULL,
    digest text NOT NULL
);

--
-- Name: case_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_keys (
    case_id uuid NOT NULL,
    tenant_id text NOT NULL,
    field text NOT NULL,
    value text NOT NULL,
    digest boolean NOT NULL,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT case_keys_field_check CHECK (((length(field) >= 1) AND (length(field) <= 100))),
    CONSTRAINT case_keys_value_check CHECK (((length(value) >= 1) AND (length(value) <= 300)))
);

--
-- Name: case_reviews; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.case_reviews WITH (security_invoker='true') AS
 SELECT r.case_id,
    r.tenant_id,
    r.attempt,
    r.seq,
    ((r.payload -> 'reviewer'::text) ->> 'subject'::text) AS reviewer,
    ((r.payload -> 'reviewer'::text) ->> 'via'::text) AS reviewer_via,
    ((r.payload -> 'reviewer'::text) ->> 'keyId'::text) AS reviewer_key_id,
    ((r.payload -> 'reviewer'::text) ->> 'name'::text) AS reviewer_name,
    (r.payload ->> 'verdict'::text) AS verdict,
    ((r.payload -> 'decision'::text) ->> 'decision'::text) AS decision,
    (r.payload -> 'decision'::text) AS decision_answer,
    (r.payload ->> 'reason'::text) AS reason,
    ((r.payload ->> 'reviewedAt'::text))::timestamp with time zone AS reviewed_at,
    r.occurred_at AS recorded_at
   FROM public.event_log r
  WHERE (r.event_type = 'CASE_REVIEWED'::text);

--
-- Name: case_secrets; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_secrets (
    case_id uuid NOT NULL,
    master_key_id text NOT NULL,
    wrapped_key bytea,
    ciphertext bytea,
    placeholders text[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    erased_at timestamp with time zone,
    erased_by text,
    CONSTRAINT case_secrets_erased_means_gone CHECK (((erased_at IS NULL) = ((wrapped_key IS NOT NULL) AND (ciphertext IS NOT NULL))))
);

--
-- Name: case_tombstones; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.case_tombstones (
    case_id uuid NOT NULL,
    tenant_id text NOT NULL,
    event_id uuid NOT NULL,
    event_hash text NOT NULL,
    policy_id bigint NOT NULL,
    policy_version integer NOT NULL,
    events_removed integer NOT NULL,
    heads jsonb NOT NULL,
    expired_by text NOT NULL,
    expired_at timestamp with time zone NOT NULL,
    archive jsonb,
    CONSTRAINT case_tombstones_event_hash_check CHECK ((event_hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT case_tombstones_events_removed_check CHECK ((events_removed >= 1))
);

--
-- Name: cases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.cases (
    case_id uuid NOT NULL,
    agent text NOT NULL,
    status text DEFAULT 'queued'::text NOT NULL,
    input jsonb NOT NULL,
    model jsonb NOT NULL,
    limits jsonb NOT NULL,
    idempotency_key text,
    request_digest text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    cycles integer DEFAULT 0 NOT NULL,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    answer jsonb,
    outcome jsonb,
    attempts_claimed integer DEFAULT 0 NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    cancel_reason text,
    terminal_published boolean DEFAULT false NOT NULL,
    tenant_id text DEFAULT 'default'::text NOT NULL,
    started_by text,
    cancelled_by text,
    decision text GENERATED ALWAYS AS ((answer ->> 'decision'::text)) STORED,
    start_resent_at timestamp with time zone,
    start_confirmed_at timestamp with time zone,
    start_publishing_until timestamp with time zone DEFAULT (now() + '00:00:30'::interval),
    checks_failed boolean GENERATED ALWAYS AS (jsonb_path_exists(outcome, '$."checks"[*]?(@."passed" == false)'::jsonpath)) STORED,
    parked_attempt integer,
    parked_at timestamp with time zone,
    review_due_at timestamp with time zone,
    folded_attempt integer,
    folded_seq integer,
    wait_kind text,
    wait_call_id text,
    wait_excludes text[] DEFAULT '{}'::text[] NOT NULL,
    start_action jsonb,
    CONSTRAINT cases_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'running'::text, 'awaiting_review'::text, 'completed'::text, 'failed'::text, 'timed_out'::text, 'cancelled'::text]))),
    CONSTRAINT cases_wait_call_id CHECK (((wait_kind = 'question'::text) = (wait_call_id IS NOT NULL))),
    CONSTRAINT cases_wait_kind_check CHECK ((wait_kind = ANY (ARRAY['review'::text, 'second_review'::text, 'question'::text])))
)
WITH (fillfactor='70');

--
-- Name: event_log_<month>; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.event_log_<month> (
    event_id uuid NOT NULL,
    case_id uuid NOT NULL,
    attempt integer NOT NULL,
    seq integer NOT NULL,
    event_type text NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    schema_version smallint NOT NULL,
    payload jsonb NOT NULL,
    tenant_id text DEFAULT 'default'::text NOT NULL,
    prev_hash text,
    hash text,
    key_id text,
    sig text,
    body bytea,
    CONSTRAINT event_log_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT event_log_event_type_check CHECK ((event_type = ANY (ARRAY['CASE_STARTED'::text, 'REACT_CYCLE'::text, 'CASE_COMPLETED'::text, 'CASE_FAILED'::text, 'CASE_TIMED_OUT'::text, 'CASE_CANCELLED'::text, 'CASE_ERASED'::text, 'CASE_AWAITING_REVIEW'::text, 'CASE_REVIEWED'::text, 'CASE_EXPIRED'::text, 'CASE_HELD'::text, 'CASE_RELEASED'::text]))),
    CONSTRAINT event_log_seq_check CHECK ((seq >= 0)),
    CONSTRAINT event_log_signed_from_version_2 CHECK (((schema_version < 2) OR ((prev_hash IS NOT NULL) AND (hash IS NOT NULL) AND (key_id IS NOT NULL) AND (sig IS NOT NULL) AND (body IS NOT NULL))))
);

--
-- Name: event_log_default; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.event_log_default (
    event_id uuid NOT NULL,
    case_id uuid NOT NULL,
    attempt integer NOT NULL,
    seq integer NOT NULL,
    event_type text NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    schema_version smallint NOT NULL,
    payload jsonb NOT NULL,
    tenant_id text DEFAULT 'default'::text NOT NULL,
    prev_hash text,
    hash text,
    key_id text,
    sig text,
    body bytea,
    CONSTRAINT event_log_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT event_log_event_type_check CHECK ((event_type = ANY (ARRAY['CASE_STARTED'::text, 'REACT_CYCLE'::text, 'CASE_COMPLETED'::text, 'CASE_FAILED'::text, 'CASE_TIMED_OUT'::text, 'CASE_CANCELLED'::text, 'CASE_ERASED'::text, 'CASE_AWAITING_REVIEW'::text, 'CASE_REVIEWED'::text, 'CASE_EXPIRED'::text, 'CASE_HELD'::text, 'CASE_RELEASED'::text]))),
    CONSTRAINT event_log_seq_check CHECK ((seq >= 0)),
    CONSTRAINT event_log_signed_from_version_2 CHECK (((schema_version < 2) OR ((prev_hash IS NOT NULL) AND (hash IS NOT NULL) AND (key_id IS NOT NULL) AND (sig IS NOT NULL) AND (body IS NOT NULL))))
);

--
-- Name: held_cases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.held_cases (
    hold_id uuid NOT NULL,
    case_id uuid NOT NULL,
    released boolean DEFAULT false NOT NULL
);

--
-- Name: ledger_acceptances; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_acceptances (
    accepted_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    tree_size bigint NOT NULL,
    root_hash bytea NOT NULL,
    note text NOT NULL,
    reason text NOT NULL,
    accepted_by text NOT NULL,
    CONSTRAINT ledger_acceptances_reason_check CHECK ((length(btrim(reason)) > 0)),
    CONSTRAINT ledger_acceptances_root_hash_check CHECK ((length(root_hash) = 32)),
    CONSTRAINT ledger_acceptances_tree_size_check CHECK ((tree_size >= 0))
);

--
-- Name: ledger_checkpoints; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_checkpoints (
    tree_size bigint NOT NULL,
    root_hash bytea NOT NULL,
    note text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ledger_checkpoints_root_hash_check CHECK ((length(root_hash) = 32)),
    CONSTRAINT ledger_checkpoints_tree_size_check CHECK ((tree_size >= 0))
);

--
-- Name: ledger_cosignatures; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_cosignatures (
    tree_size bigint NOT NULL,
    witness text NOT NULL,
    line text NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: ledger_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_keys (
    verifier_key text NOT NULL,
    origin text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: ledger_leaves; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_leaves (
    leaf_index bigint NOT NULL,
    event_id uuid NOT NULL,
    case_id uuid NOT NULL,
    event_hash text,
    kind text DEFAULT 'event'::text NOT NULL,
    CONSTRAINT ledger_leaves_event_hash_check CHECK ((event_hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT ledger_leaves_kind CHECK ((kind = ANY (ARRAY['event'::text, 'backtest'::text]))),
    CONSTRAINT ledger_leaves_leaf_index_check CHECK ((leaf_index >= 0))
);

--
-- Name: ledger_queue; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_queue (
    queued_id bigint NOT NULL,
    event_id uuid NOT NULL,
    case_id uuid NOT NULL,
    hash text NOT NULL,
    kind text DEFAULT 'event'::text NOT NULL,
    CONSTRAINT ledger_queue_hash_check CHECK ((hash ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT ledger_queue_kind_check CHECK ((kind = ANY (ARRAY['event'::text, 'backtest'::text])))
);

--
-- Name: ledger_queue_queued_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.ledger_queue_queued_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: ledger_queue_queued_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.ledger_queue_queued_id_seq OWNED BY public.ledger_queue.queued_id;

--
-- Name: ledger_tiles; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_tiles (
    level smallint NOT NULL,
    tile_index bigint NOT NULL,
    hashes bytea NOT NULL,
    CONSTRAINT ledger_tiles_hashes_check CHECK ((((length(hashes) >= 32) AND (length(hashes) <= 8192)) AND ((length(hashes) % 32) = 0))),
    CONSTRAINT ledger_tiles_level_check CHECK ((level >= 0)),
    CONSTRAINT ledger_tiles_tile_index_check CHECK ((tile_index >= 0))
);

--
-- Name: legal_hold_releases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.legal_hold_releases (
    hold_id uuid NOT NULL,
    person text NOT NULL,
    reason text NOT NULL,
    released_at timestamp with time zone DEFAULT now() NOT NULL,
    action jsonb,
    CONSTRAINT legal_hold_releases_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 2000)))
);

--
-- Name: legal_holds; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.legal_holds (
    hold_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id text NOT NULL,
    scope text NOT NULL,
    case_id uuid,
    key_field text,
    key_value text,
    reason text NOT NULL,
    ends_at timestamp with time zone,
    placed_by text NOT NULL,
    placed_at timestamp with time zone DEFAULT now() NOT NULL,
    action jsonb,
    CONSTRAINT legal_holds_check CHECK (((scope = 'case'::text) = (case_id IS NOT NULL))),
    CONSTRAINT legal_holds_check1 CHECK (((scope = 'business_key'::text) = ((key_field IS NOT NULL) AND (key_value IS NOT NULL)))),
    CONSTRAINT legal_holds_key_field_check CHECK (((length(key_field) >= 1) AND (length(key_field) <= 100))),
    CONSTRAINT legal_holds_key_value_check CHECK (((length(key_value) >= 1) AND (length(key_value) <= 300))),
    CONSTRAINT legal_holds_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 2000))),
    CONSTRAINT legal_holds_scope_check CHECK ((scope = ANY (ARRAY['case'::text, 'business_key'::text, 'tenant'::text])))
);

--
-- Name: person_identities; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.person_identities (
    identity text NOT NULL,
    person text NOT NULL,
    linked_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT person_identities_identity_check CHECK ((identity ~ '^(oidc|key):[^[:cntrl:]]{1,200}$'::text)),
    CONSTRAINT person_identities_person_check CHECK ((person ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$'::text))
);

--
-- Name: react_cycles; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.react_cycles WITH (security_invoker='true') AS
 SELECT e.case_id,
    e.attempt,
    e.seq,
    e.event_id,
    e.occurred_at,
    ((e.payload ->> 'cycleIndex'::text))::integer AS cycle_index,
    (e.payload ->> 'reasoningText'::text) AS reasoning_text,
    (((e.payload -> 'tokenUsage'::text) ->> 'inputTokens'::text))::integer AS input_tokens,
    (((e.payload -> 'tokenUsage'::text) ->> 'outputTokens'::text))::integer AS output_tokens,
    jsonb_array_length((e.payload -> 'toolCalls'::text)) AS tool_call_count,
    (e.payload ->> 'model'::text) AS model,
    (e.payload ->> 'finishReason'::text) AS finish_reason
   FROM public.event_log e
  WHERE (e.event_type = 'REACT_CYCLE'::text);

--
-- Name: react_tool_calls; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.react_tool_calls WITH (security_invoker='true') AS
 SELECT e.case_id,
    e.attempt,
    e.seq,
    ((e.payload ->> 'cycleIndex'::text))::integer AS cycle_index,
    ((t.ordinal - 1))::integer AS call_index,
    (t.call ->> 'toolName'::text) AS tool_name,
    (t.call -> 'toolArgs'::text) AS tool_args,
    (t.call -> 'toolResult'::text) AS tool_result,
    (t.call ->> 'toolSource'::text) AS tool_source,
    ((t.call ->> 'durationMs'::text))::integer AS duration_ms,
    (t.call ->> 'error'::text) AS error,
    COALESCE(jsonb_array_length((t.call -> 'attempts'::text)), 0) AS attempt_count,
    e.occurred_at
   FROM (public.event_log e
     CROSS JOIN LATERAL jsonb_array_elements((e.payload -> 'toolCalls'::text)) WITH ORDINALITY t(call, ordinal))
  WHERE (e.event_type = 'REACT_CYCLE'::text);

--
-- Name: retention_approvals; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.retention_approvals (
    policy_id bigint NOT NULL,
    approved_by text NOT NULL,
    approved_at timestamp with time zone DEFAULT now() NOT NULL,
    action jsonb
);

--
-- Name: retention_business_dates; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.retention_business_dates (
    tenant_id text NOT NULL,
    field text NOT NULL,
    value text NOT NULL,
    ended_on date NOT NULL,
    set_by text NOT NULL,
    set_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT retention_business_dates_field_check CHECK (((length(field) >= 1) AND (length(field) <= 100))),
    CONSTRAINT retention_business_dates_value_check CHECK (((length(value) >= 1) AND (length(value) <= 300)))
);

--
-- Name: retention_floor; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.retention_floor (
    only_row boolean DEFAULT true NOT NULL,
    min_days integer NOT NULL,
    source text NOT NULL,
    CONSTRAINT retention_floor_min_days_check CHECK ((min_days >= 183)),
    CONSTRAINT retention_floor_only_row_check CHECK (only_row)
);

--
-- Name: retention_policies; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.retention_policies (
    policy_id bigint NOT NULL,
    tenant_id text NOT NULL,
    agent text DEFAULT '*'::text NOT NULL,
    version integer NOT NULL,
    keep_days integer,
    counted_from text DEFAULT 'ended'::text NOT NULL,
    business_key text,
    personal_data_days integer,
    archive boolean DEFAULT false NOT NULL,
    preset text,
    reason text NOT NULL,
    set_by text NOT NULL,
    set_at timestamp with time zone DEFAULT now() NOT NULL,
    needs_second boolean DEFAULT false NOT NULL,
    action jsonb,
    CONSTRAINT retention_policies_agent_check CHECK (((length(agent) >= 1) AND (length(agent) <= 100))),
    CONSTRAINT retention_policies_business_key_check CHECK (((length(business_key) >= 1) AND (length(business_key) <= 100))),
    CONSTRAINT retention_policies_check CHECK (((personal_data_days IS NULL) OR (keep_days IS NULL) OR (personal_data_days <= keep_days))),
    CONSTRAINT retention_policies_check1 CHECK (((counted_from = 'business_date'::text) = (business_key IS NOT NULL))),
    CONSTRAINT retention_policies_counted_from_check CHECK ((counted_from = ANY (ARRAY['ended'::text, 'business_date'::text]))),
    CONSTRAINT retention_policies_keep_days_check CHECK ((keep_days >= 1)),
    CONSTRAINT retention_policies_personal_data_days_check CHECK ((personal_data_days >= 1)),
    CONSTRAINT retention_policies_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 2000))),
    CONSTRAINT retention_policies_version_check CHECK ((version >= 1))
);

--
-- Name: retention_in_force; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.retention_in_force AS
 SELECT DISTINCT ON (p.tenant_id, p.agent) p.policy_id,
    p.tenant_id,
    p.agent,
    p.version,
    p.keep_days,
    p.counted_from,
    p.business_key,
    p.personal_data_days,
    p.archive,
    p.preset,
    p.reason,
    p.set_by,
    p.set_at,
    p.needs_second,
    p.action
   FROM public.retention_policies p
  WHERE ((NOT p.needs_second) OR (EXISTS ( SELECT 1
           FROM public.retention_approvals a
          WHERE (a.policy_id = p.policy_id))))
  ORDER BY p.tenant_id, p.agent, p.version DESC;

--
-- Name: retention_policies_policy_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.retention_policies ALTER COLUMN policy_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.retention_policies_policy_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: signing_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.signing_keys (
    key_id text NOT NULL,
    public_key bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    not_valid_after timestamp with time zone,
    CONSTRAINT signing_keys_check CHECK (((retired_at IS NULL) = (not_valid_after IS NULL))),
    CONSTRAINT signing_keys_key_id_check CHECK ((key_id ~ '^[0-9a-f]{16}$'::text)),
    CONSTRAINT signing_keys_public_key_check CHECK ((length(public_key) = 32))
);

--
-- Name: starts_before_signing; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.starts_before_signing (
    case_id uuid NOT NULL
);

--
-- Name: subscribers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.subscribers (
    name text NOT NULL,
    tenant_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT subscribers_name_check CHECK ((name ~ '^[a-z0-9][a-z0-9-]{0,39}$'::text)),
    CONSTRAINT subscribers_tenant_id_check CHECK ((tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'::text))
);

--
-- Name: tenant_readers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.tenant_readers (
    role_name text NOT NULL,
    tenant_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenant_readers_tenant_id_check CHECK ((tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'::text))
);

--
-- Name: event_log_<month>; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log ATTACH PARTITION public.event_log_<month> FOR VALUES FROM (<month start>) TO (<next month start>);

--
-- Name: event_log_default; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log ATTACH PARTITION public.event_log_default DEFAULT;

--
-- Name: ledger_queue queued_id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_queue ALTER COLUMN queued_id SET DEFAULT nextval('public.ledger_queue_queued_id_seq'::regclass);

--
-- Name: access_log access_log_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.access_log
    ADD CONSTRAINT access_log_pkey PRIMARY KEY (access_id);

--
-- Name: action_keys action_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.action_keys
    ADD CONSTRAINT action_keys_pkey PRIMARY KEY (key_id);

--
-- Name: action_keys action_keys_public_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.action_keys
    ADD CONSTRAINT action_keys_public_key_key UNIQUE (public_key);

--
-- Name: api_keys api_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (key_id);

--
-- Name: audit_keys audit_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_keys
    ADD CONSTRAINT audit_keys_pkey PRIMARY KEY (key_id);

--
-- Name: audit_runs audit_runs_chain_seq_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_runs
    ADD CONSTRAINT audit_runs_chain_seq_key UNIQUE (chain_seq);

--
-- Name: audit_runs audit_runs_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_runs
    ADD CONSTRAINT audit_runs_hash_key UNIQUE (hash);

--
-- Name: audit_runs audit_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_runs
    ADD CONSTRAINT audit_runs_pkey PRIMARY KEY (run_id);

--
-- Name: backtest_records backtest_records_chain_seq_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_records
    ADD CONSTRAINT backtest_records_chain_seq_key UNIQUE (chain_seq);

--
-- Name: backtest_records backtest_records_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_records
    ADD CONSTRAINT backtest_records_hash_key UNIQUE (hash);

--
-- Name: backtest_records backtest_records_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_records
    ADD CONSTRAINT backtest_records_pkey PRIMARY KEY (backtest_id);

--
-- Name: backtest_results backtest_results_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_results
    ADD CONSTRAINT backtest_results_pkey PRIMARY KEY (backtest_id, "position");

--
-- Name: backtests backtests_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtests
    ADD CONSTRAINT backtests_pkey PRIMARY KEY (backtest_id);

--
-- Name: capability_keys capability_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.capability_keys
    ADD CONSTRAINT capability_keys_pkey PRIMARY KEY (capability);

--
-- Name: case_actions case_actions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_actions
    ADD CONSTRAINT case_actions_pkey PRIMARY KEY (case_id, parked_attempt);

--
-- Name: case_actions_refused case_actions_refused_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_actions_refused
    ADD CONSTRAINT case_actions_refused_pkey PRIMARY KEY (refusal_id);

--
-- Name: case_key_marks case_key_marks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_key_marks
    ADD CONSTRAINT case_key_marks_pkey PRIMARY KEY (case_id, field);

--
-- Name: case_keys case_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_keys
    ADD CONSTRAINT case_keys_pkey PRIMARY KEY (case_id, field);

--
-- Name: case_secrets case_secrets_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_secrets
    ADD CONSTRAINT case_secrets_pkey PRIMARY KEY (case_id);

--
-- Name: case_tombstones case_tombstones_event_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_tombstones
    ADD CONSTRAINT case_tombstones_event_id_key UNIQUE (event_id);

--
-- Name: case_tombstones case_tombstones_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_tombstones
    ADD CONSTRAINT case_tombstones_pkey PRIMARY KEY (case_id);

--
-- Name: cases cases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.cases
    ADD CONSTRAINT cases_pkey PRIMARY KEY (case_id);

--
-- Name: event_log_<month> event_log_<month>_case_attempt_seq; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log_<month>
    ADD CONSTRAINT event_log_<month>_case_attempt_seq UNIQUE (case_id, attempt, seq) INCLUDE (event_type);

--
-- Name: event_log_<month> event_log_<month>_case_event; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log_<month>
    ADD CONSTRAINT event_log_<month>_case_event UNIQUE (case_id, event_id);

--
-- Name: event_log_default event_log_default_case_attempt_seq; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log_default
    ADD CONSTRAINT event_log_default_case_attempt_seq UNIQUE (case_id, attempt, seq) INCLUDE (event_type);

--
-- Name: event_log_default event_log_default_event_id; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.event_log_default
    ADD CONSTRAINT event_log_default_event_id PRIMARY KEY (event_id);

--
-- Name: event_log event_log_restates_body; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.event_log
    ADD CONSTRAINT event_log_restates_body CHECK (public.event_log_restates_body(body, payload, event_id, case_id, attempt, seq, event_type, tenant_id, occurred_at, schema_version, prev_hash, hash)) NOT VALID;

--
-- Name: held_cases held_cases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.held_cases
    ADD CONSTRAINT held_cases_pkey PRIMARY KEY (hold_id, case_id);

--
-- Name: ledger_checkpoints ledger_checkpoints_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_checkpoints
    ADD CONSTRAINT ledger_checkpoints_pkey PRIMARY KEY (tree_size);

--
-- Name: ledger_cosignatures ledger_cosignatures_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_cosignatures
    ADD CONSTRAINT ledger_cosignatures_pkey PRIMARY KEY (tree_size, witness);

--
-- Name: ledger_keys ledger_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_keys
    ADD CONSTRAINT ledger_keys_pkey PRIMARY KEY (verifier_key);

--
-- Name: ledger_leaves ledger_leaves_event_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_leaves
    ADD CONSTRAINT ledger_leaves_event_id_key UNIQUE (event_id);

--
-- Name: ledger_leaves ledger_leaves_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_leaves
    ADD CONSTRAINT ledger_leaves_pkey PRIMARY KEY (leaf_index);

--
-- Name: ledger_queue ledger_queue_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_queue
    ADD CONSTRAINT ledger_queue_pkey PRIMARY KEY (queued_id);

--
-- Name: ledger_tiles ledger_tiles_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_tiles
    ADD CONSTRAINT ledger_tiles_pkey PRIMARY KEY (level, tile_index);

--
-- Name: legal_hold_releases legal_hold_releases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.legal_hold_releases
    ADD CONSTRAINT legal_hold_releases_pkey PRIMARY KEY (hold_id, person);

--
-- Name: legal_holds legal_holds_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.legal_holds
    ADD CONSTRAINT legal_holds_pkey PRIMARY KEY (hold_id);

--
-- Name: person_identities person_identities_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.person_identities
    ADD CONSTRAINT person_identities_pkey PRIMARY KEY (identity);

--
-- Name: retention_approvals retention_approvals_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_approvals
    ADD CONSTRAINT retention_approvals_pkey PRIMARY KEY (policy_id);

--
-- Name: retention_business_dates retention_business_dates_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_business_dates
    ADD CONSTRAINT retention_business_dates_pkey PRIMARY KEY (tenant_id, field, value, set_at);

--
-- Name: retention_floor retention_floor_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_floor
    ADD CONSTRAINT retention_floor_pkey PRIMARY KEY (only_row);

--
-- Name: retention_policies retention_policies_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_policies
    ADD CONSTRAINT retention_policies_pkey PRIMARY KEY (policy_id);

--
-- Name: retention_policies retention_policies_tenant_id_agent_version_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_policies
    ADD CONSTRAINT retention_policies_tenant_id_agent_version_key UNIQUE (tenant_id, agent, version);

--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

--
-- Name: signing_keys signing_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.signing_keys
    ADD CONSTRAINT signing_keys_pkey PRIMARY KEY (key_id);

--
-- Name: signing_keys signing_keys_public_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.signing_keys
    ADD CONSTRAINT signing_keys_public_key_key UNIQUE (public_key);

--
-- Name: starts_before_signing starts_before_signing_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.starts_before_signing
    ADD CONSTRAINT starts_before_signing_pkey PRIMARY KEY (case_id);

--
-- Name: subscribers subscribers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.subscribers
    ADD CONSTRAINT subscribers_pkey PRIMARY KEY (name);

--
-- Name: tenant_readers tenant_readers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant_readers
    ADD CONSTRAINT tenant_readers_pkey PRIMARY KEY (role_name);

--
-- Name: access_log_case; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX access_log_case ON public.access_log USING btree (case_id, at);

--
-- Name: backtests_of_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX backtests_of_tenant ON public.backtests USING btree (tenant_id, requested_at);

--
-- Name: backtests_waiting; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX backtests_waiting ON public.backtests USING btree (requested_at) WHERE (status = ANY (ARRAY['queued'::text, 'running'::text]));

--
-- Name: case_actions_refused_case; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX case_actions_refused_case ON public.case_actions_refused USING btree (case_id);

--
-- Name: case_key_marks_by_digest; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX case_key_marks_by_digest ON public.case_key_marks USING btree (tenant_id, field, digest);

--
-- Name: case_keys_by_field; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX case_keys_by_field ON public.case_keys USING btree (tenant_id, field, value, created_at DESC, case_id DESC);

--
-- Name: case_keys_by_value; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX case_keys_by_value ON public.case_keys USING btree (tenant_id, value, created_at DESC, case_id DESC);

--
-- Name: cases_awaiting_review; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_awaiting_review ON public.cases USING btree (tenant_id, parked_at, case_id) WHERE (status = 'awaiting_review'::text);

--
-- Name: cases_search_agent; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_agent ON public.cases USING btree (tenant_id, agent, created_at DESC, case_id DESC);

--
-- Name: cases_search_agent_decision; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_agent_decision ON public.cases USING btree (tenant_id, agent, decision, created_at DESC, case_id DESC) WHERE (decision IS NOT NULL);

--
-- Name: cases_search_checks_failed; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_checks_failed ON public.cases USING btree (tenant_id, created_at DESC, case_id DESC) WHERE checks_failed;

--
-- Name: cases_search_decision; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_decision ON public.cases USING btree (tenant_id, decision, created_at DESC, case_id DESC) WHERE (decision IS NOT NULL);

--
-- Name: cases_search_recent; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_recent ON public.cases USING btree (tenant_id, created_at DESC, case_id DESC);

--
-- Name: cases_search_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_search_status ON public.cases USING btree (tenant_id, status, created_at DESC, case_id DESC);

--
-- Name: cases_tenant_active; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cases_tenant_active ON public.cases USING btree (tenant_id) WHERE (status = ANY (ARRAY['queued'::text, 'running'::text]));

--
-- Name: cases_tenant_idempotency_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX cases_tenant_idempotency_key ON public.cases USING btree (tenant_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: held_cases_open; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX held_cases_open ON public.held_cases USING btree (hold_id) WHERE (NOT released);

--
-- Name: ledger_leaves_case; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ledger_leaves_case ON public.ledger_leaves USING btree (case_id);

--
-- Name: ledger_leaves_event_hash; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ledger_leaves_event_hash ON public.ledger_leaves USING btree (event_hash);

--
-- Name: legal_holds_case; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX legal_holds_case ON public.legal_holds USING btree (case_id) WHERE (case_id IS NOT NULL);

--
-- Name: legal_holds_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX legal_holds_tenant ON public.legal_holds USING btree (tenant_id, placed_at);

--
-- Name: person_identities_person; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX person_identities_person ON public.person_identities USING btree (person);

--
-- Name: access_log access_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER access_log_no_truncate BEFORE TRUNCATE ON public.access_log FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.access_log ENABLE ALWAYS TRIGGER access_log_no_truncate;

--
-- Name: access_log access_log_no_update_or_delete; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER access_log_no_update_or_delete BEFORE DELETE OR UPDATE ON public.access_log FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.access_log ENABLE ALWAYS TRIGGER access_log_no_update_or_delete;

--
-- Name: audit_runs audit_runs_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER audit_runs_append_only BEFORE DELETE OR UPDATE ON public.audit_runs FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.audit_runs ENABLE ALWAYS TRIGGER audit_runs_append_only;

--
-- Name: audit_runs audit_runs_chain; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER audit_runs_chain BEFORE INSERT ON public.audit_runs FOR EACH ROW EXECUTE FUNCTION public.audit_run_chains();

ALTER TABLE public.audit_runs ENABLE ALWAYS TRIGGER audit_runs_chain;

--
-- Name: audit_runs audit_runs_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER audit_runs_no_truncate BEFORE TRUNCATE ON public.audit_runs FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.audit_runs ENABLE ALWAYS TRIGGER audit_runs_no_truncate;

--
-- Name: backtest_records backtest_records_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_records_append_only BEFORE DELETE OR UPDATE ON public.backtest_records FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.backtest_records ENABLE ALWAYS TRIGGER backtest_records_append_only;

--
-- Name: backtest_records backtest_records_chain; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_records_chain BEFORE INSERT ON public.backtest_records FOR EACH ROW EXECUTE FUNCTION public.backtest_record_chains();

ALTER TABLE public.backtest_records ENABLE ALWAYS TRIGGER backtest_records_chain;

--
-- Name: backtest_records backtest_records_enter_ledger; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_records_enter_ledger AFTER INSERT ON public.backtest_records FOR EACH ROW EXECUTE FUNCTION public.backtest_record_enters_ledger();

ALTER TABLE public.backtest_records ENABLE ALWAYS TRIGGER backtest_records_enter_ledger;

--
-- Name: backtest_records backtest_records_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_records_no_truncate BEFORE TRUNCATE ON public.backtest_records FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.backtest_records ENABLE ALWAYS TRIGGER backtest_records_no_truncate;

--
-- Name: backtest_results backtest_results_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_results_append_only BEFORE DELETE OR UPDATE ON public.backtest_results FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.backtest_results ENABLE ALWAYS TRIGGER backtest_results_append_only;

--
-- Name: backtest_results backtest_results_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER backtest_results_no_truncate BEFORE TRUNCATE ON public.backtest_results FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.backtest_results ENABLE ALWAYS TRIGGER backtest_results_no_truncate;

--
-- Name: case_actions_refused case_actions_refused_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_actions_refused_append_only BEFORE DELETE OR UPDATE ON public.case_actions_refused FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.case_actions_refused ENABLE ALWAYS TRIGGER case_actions_refused_append_only;

--
-- Name: case_actions_refused case_actions_refused_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_actions_refused_no_truncate BEFORE TRUNCATE ON public.case_actions_refused FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.case_actions_refused ENABLE ALWAYS TRIGGER case_actions_refused_no_truncate;

--
-- Name: case_keys case_keys_marked; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_keys_marked AFTER DELETE ON public.case_keys FOR EACH ROW WHEN (old.digest) EXECUTE FUNCTION public.case_keys_marked();

ALTER TABLE public.case_keys ENABLE ALWAYS TRIGGER case_keys_marked;

--
-- Name: case_keys case_keys_with_their_case; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_keys_with_their_case AFTER INSERT ON public.case_keys FOR EACH ROW EXECUTE FUNCTION public.case_keys_with_their_case();

ALTER TABLE public.case_keys ENABLE ALWAYS TRIGGER case_keys_with_their_case;

--
-- Name: case_secrets case_secrets_not_held; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_secrets_not_held BEFORE UPDATE ON public.case_secrets FOR EACH ROW EXECUTE FUNCTION public.case_secrets_not_held();

ALTER TABLE public.case_secrets ENABLE ALWAYS TRIGGER case_secrets_not_held;

--
-- Name: case_tombstones case_tombstones_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_tombstones_append_only BEFORE DELETE OR UPDATE ON public.case_tombstones FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.case_tombstones ENABLE ALWAYS TRIGGER case_tombstones_append_only;

--
-- Name: case_tombstones case_tombstones_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER case_tombstones_no_truncate BEFORE TRUNCATE ON public.case_tombstones FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.case_tombstones ENABLE ALWAYS TRIGGER case_tombstones_no_truncate;

--
-- Name: cases cases_kept; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER cases_kept BEFORE DELETE ON public.cases FOR EACH ROW EXECUTE FUNCTION public.cases_kept();

ALTER TABLE public.cases ENABLE ALWAYS TRIGGER cases_kept;

--
-- Name: event_log event_log_enters_ledger; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_enters_ledger AFTER INSERT ON public.event_log REFERENCING NEW TABLE AS stored FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_enters_ledger();

ALTER TABLE public.event_log ENABLE ALWAYS TRIGGER event_log_enters_ledger;

--
-- Name: event_log event_log_erases_values; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_erases_values AFTER INSERT ON public.event_log REFERENCING NEW TABLE AS stored FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_erases_values();

ALTER TABLE public.event_log ENABLE ALWAYS TRIGGER event_log_erases_values;

--
-- Name: event_log event_log_folds_into_cases; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_folds_into_cases AFTER INSERT ON public.event_log REFERENCING NEW TABLE AS stored FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_folds_into_cases();

ALTER TABLE public.event_log ENABLE ALWAYS TRIGGER event_log_folds_into_cases;

--
-- Name: event_log event_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_no_truncate BEFORE TRUNCATE ON public.event_log FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_append_only();

ALTER TABLE public.event_log ENABLE ALWAYS TRIGGER event_log_no_truncate;

--
-- Name: event_log_<month> event_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_no_truncate BEFORE TRUNCATE ON public.event_log_<month> FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_append_only();

ALTER TABLE public.event_log_<month> ENABLE ALWAYS TRIGGER event_log_no_truncate;

--
-- Name: event_log_default event_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_no_truncate BEFORE TRUNCATE ON public.event_log_default FOR EACH STATEMENT EXECUTE FUNCTION public.event_log_append_only();

ALTER TABLE public.event_log_default ENABLE ALWAYS TRIGGER event_log_no_truncate;

--
-- Name: event_log event_log_no_update_or_delete; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_log_no_update_or_delete BEFORE DELETE OR UPDATE ON public.event_log FOR EACH ROW EXECUTE FUNCTION public.event_log_append_only();

ALTER TABLE public.event_log ENABLE ALWAYS TRIGGER event_log_no_update_or_delete;

--
-- Name: ledger_acceptances ledger_acceptances_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_acceptances_append_only BEFORE DELETE OR UPDATE ON public.ledger_acceptances FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

--
-- Name: ledger_acceptances ledger_acceptances_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_acceptances_no_truncate BEFORE TRUNCATE ON public.ledger_acceptances FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

--
-- Name: ledger_checkpoints ledger_checkpoints_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_checkpoints_append_only BEFORE DELETE OR UPDATE ON public.ledger_checkpoints FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_checkpoints ENABLE ALWAYS TRIGGER ledger_checkpoints_append_only;

--
-- Name: ledger_checkpoints ledger_checkpoints_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_checkpoints_no_truncate BEFORE TRUNCATE ON public.ledger_checkpoints FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_checkpoints ENABLE ALWAYS TRIGGER ledger_checkpoints_no_truncate;

--
-- Name: ledger_leaves ledger_leaves_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_leaves_append_only BEFORE DELETE OR UPDATE ON public.ledger_leaves FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_leaves ENABLE ALWAYS TRIGGER ledger_leaves_append_only;

--
-- Name: ledger_leaves ledger_leaves_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_leaves_no_truncate BEFORE TRUNCATE ON public.ledger_leaves FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_leaves ENABLE ALWAYS TRIGGER ledger_leaves_no_truncate;

--
-- Name: ledger_tiles ledger_tiles_no_delete; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_tiles_no_delete BEFORE DELETE ON public.ledger_tiles FOR EACH ROW EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_no_delete;

--
-- Name: ledger_tiles ledger_tiles_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_tiles_no_truncate BEFORE TRUNCATE ON public.ledger_tiles FOR EACH STATEMENT EXECUTE FUNCTION public.ledger_append_only();

ALTER TABLE public.ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_no_truncate;

--
-- Name: ledger_tiles ledger_tiles_only_grow; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER ledger_tiles_only_grow BEFORE UPDATE ON public.ledger_tiles FOR EACH ROW EXECUTE FUNCTION public.ledger_tile_only_grows();

ALTER TABLE public.ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_only_grow;

--
-- Name: legal_hold_releases legal_hold_releases_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER legal_hold_releases_append_only BEFORE DELETE OR UPDATE ON public.legal_hold_releases FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.legal_hold_releases ENABLE ALWAYS TRIGGER legal_hold_releases_append_only;

--
-- Name: legal_hold_releases legal_hold_releases_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER legal_hold_releases_no_truncate BEFORE TRUNCATE ON public.legal_hold_releases FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.legal_hold_releases ENABLE ALWAYS TRIGGER legal_hold_releases_no_truncate;

--
-- Name: legal_holds legal_holds_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER legal_holds_append_only BEFORE DELETE OR UPDATE ON public.legal_holds FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.legal_holds ENABLE ALWAYS TRIGGER legal_holds_append_only;

--
-- Name: legal_holds legal_holds_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER legal_holds_no_truncate BEFORE TRUNCATE ON public.legal_holds FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.legal_holds ENABLE ALWAYS TRIGGER legal_holds_no_truncate;

--
-- Name: retention_approvals retention_approval_checked; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_approval_checked BEFORE INSERT ON public.retention_approvals FOR EACH ROW EXECUTE FUNCTION public.retention_approval_checked();

--
-- Name: retention_approvals retention_approvals_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_approvals_append_only BEFORE DELETE OR UPDATE ON public.retention_approvals FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_approvals ENABLE ALWAYS TRIGGER retention_approvals_append_only;

--
-- Name: retention_approvals retention_approvals_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_approvals_no_truncate BEFORE TRUNCATE ON public.retention_approvals FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_approvals ENABLE ALWAYS TRIGGER retention_approvals_no_truncate;

--
-- Name: retention_business_dates retention_business_dates_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_business_dates_append_only BEFORE DELETE OR UPDATE ON public.retention_business_dates FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_business_dates ENABLE ALWAYS TRIGGER retention_business_dates_append_only;

--
-- Name: retention_business_dates retention_business_dates_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_business_dates_no_truncate BEFORE TRUNCATE ON public.retention_business_dates FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_business_dates ENABLE ALWAYS TRIGGER retention_business_dates_no_truncate;

--
-- Name: retention_policies retention_policies_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_policies_append_only BEFORE DELETE OR UPDATE ON public.retention_policies FOR EACH ROW EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_policies ENABLE ALWAYS TRIGGER retention_policies_append_only;

--
-- Name: retention_policies retention_policies_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_policies_no_truncate BEFORE TRUNCATE ON public.retention_policies FOR EACH STATEMENT EXECUTE FUNCTION public.append_only();

ALTER TABLE public.retention_policies ENABLE ALWAYS TRIGGER retention_policies_no_truncate;

--
-- Name: retention_policies retention_policy_checked; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER retention_policy_checked BEFORE INSERT ON public.retention_policies FOR EACH ROW EXECUTE FUNCTION public.retention_policy_checked();

--
-- Name: backtest_records backtest_records_backtest_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_records
    ADD CONSTRAINT backtest_records_backtest_id_fkey FOREIGN KEY (backtest_id) REFERENCES public.backtests(backtest_id);

--
-- Name: backtest_results backtest_results_backtest_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.backtest_results
    ADD CONSTRAINT backtest_results_backtest_id_fkey FOREIGN KEY (backtest_id) REFERENCES public.backtests(backtest_id);

--
-- Name: case_actions case_actions_case_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_actions
    ADD CONSTRAINT case_actions_case_id_fkey FOREIGN KEY (case_id) REFERENCES public.cases(case_id) ON DELETE CASCADE;

--
-- Name: case_keys case_keys_case_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_keys
    ADD CONSTRAINT case_keys_case_id_fkey FOREIGN KEY (case_id) REFERENCES public.cases(case_id) ON DELETE CASCADE;

--
-- Name: case_secrets case_secrets_case_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.case_secrets
    ADD CONSTRAINT case_secrets_case_id_fkey FOREIGN KEY (case_id) REFERENCES public.cases(case_id) ON DELETE CASCADE;

--
-- Name: ledger_cosignatures ledger_cosignatures_tree_size_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_cosignatures
    ADD CONSTRAINT ledger_cosignatures_tree_size_fkey FOREIGN KEY (tree_size) REFERENCES public.ledger_checkpoints(tree_size);

--
-- Name: legal_hold_releases legal_hold_releases_hold_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.legal_hold_releases
    ADD CONSTRAINT legal_hold_releases_hold_id_fkey FOREIGN KEY (hold_id) REFERENCES public.legal_holds(hold_id);

--
-- Name: retention_approvals retention_approvals_policy_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retention_approvals
    ADD CONSTRAINT retention_approvals_policy_id_fkey FOREIGN KEY (policy_id) REFERENCES public.retention_policies(policy_id);

--
-- Name: cases; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.cases ENABLE ROW LEVEL SECURITY;

--
-- Name: event_log; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.event_log ENABLE ROW LEVEL SECURITY;

--
-- Name: cases tenant_reader; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY tenant_reader ON public.cases FOR SELECT USING ((tenant_id = public.reader_tenant()));

--
-- Name: event_log tenant_reader; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY tenant_reader ON public.event_log FOR SELECT USING ((tenant_id = public.reader_tenant()));


--
-- PostgreSQL database dump complete
--
