-- casetrail schema, version 29: archive before expiry (docs/design.md, "Keeping records
-- as long as the law says"; docs/bundle.md, "Archives").
--
-- A policy may say that a case's bundle is archived before its events go. The worker's
-- retention pass writes the bundle and a signed manifest, then appends CASE_EXPIRED
-- naming both (file and SHA-256); the tombstone keeps that too. The owner's
-- expire_case() refuses a case whose policy archives and whose tombstone names no
-- archive; and dropping archiving from a policy takes a second person, as keeping
-- less does.
ALTER TABLE case_tombstones ADD COLUMN archive jsonb;

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

CREATE OR REPLACE FUNCTION expire_case(p_case uuid) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION retention_policy_checked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
