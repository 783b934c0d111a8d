-- casetrail schema, version 31: the log partitioned by case, for years (docs/design.md,
-- "A log partitioned for years").
--
-- New cases get time-ordered ids (UUIDv7: the first 48 bits are the start's Unix time
-- in milliseconds), so a range of case ids is a range of start times. event_log becomes
-- a table partitioned by case_id range, one partition a calendar month (UTC) of starts:
-- (case_id, attempt, seq) and (case_id, event_id) stay unique (each partition's keys, a
-- case being in one partition), and an insert touches one month's small indexes, never
-- the whole log's.
-- The log as it was (random case ids) becomes the default partition, which also takes
-- any case whose month has no partition.
--
-- Partitions bypass what is defined on the parent when addressed directly: no component
-- is granted anything on a partition (setup revokes all; reads and writes go through
-- event_log, its policies and its triggers), and every partition refuses TRUNCATE itself.
-- A whole month goes only through the owner's event_log_drop_expired_partitions(), once
-- every case in it has expired (the tombstone kept, the case row gone, no hold): its
-- CASE_EXPIRED rows move to the default partition first, so every expired case keeps
-- its signed tombstone event.

-- The log so far, renamed with its keys (event_id alone, and (case_id, attempt, seq)).
ALTER TABLE event_log RENAME TO event_log_default;
ALTER TABLE event_log_default RENAME CONSTRAINT event_log_pkey TO event_log_default_event_id;
ALTER TABLE event_log_default RENAME CONSTRAINT event_log_case_attempt_seq
    TO event_log_default_case_attempt_seq;
-- A partition holds no trigger with a transition table and takes its row triggers from
-- the parent; its own TRUNCATE trigger stays.
DROP TRIGGER event_log_enters_ledger ON event_log_default;
DROP TRIGGER event_log_no_update_or_delete ON event_log_default;

CREATE TABLE event_log (LIKE event_log_default INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                        INCLUDING STORAGE INCLUDING COMPRESSION)
    PARTITION BY RANGE (case_id);
-- The unique keys are each partition's own, made with it (below), not the parent's: the
-- same guarantee, since a case's events are all in one partition, and `pg_restore
-- --clean` (the restore runbook's) can drop them, which it cannot do for keys a partition
-- inherits. An insert's ON CONFLICT DO NOTHING takes the partition's keys as arbiters.

CREATE TRIGGER event_log_no_update_or_delete BEFORE UPDATE OR DELETE ON event_log
    FOR EACH ROW EXECUTE FUNCTION event_log_append_only();
CREATE TRIGGER event_log_no_truncate BEFORE TRUNCATE ON event_log
    FOR EACH STATEMENT EXECUTE FUNCTION event_log_append_only();
CREATE TRIGGER event_log_enters_ledger AFTER INSERT ON event_log
    REFERENCING NEW TABLE AS stored FOR EACH STATEMENT EXECUTE FUNCTION event_log_enters_ledger();
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_update_or_delete;
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_truncate;
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_enters_ledger;

-- Who may read and append, and what rows a reader sees, move to the parent.
ALTER TABLE event_log ENABLE ROW LEVEL SECURITY;
DO $$
DECLARE
    p record;
    g record;
BEGIN
    FOR p IN SELECT * FROM pg_policies
             WHERE schemaname = 'public' AND tablename = 'event_log_default' LOOP
        EXECUTE format('CREATE POLICY %I ON event_log AS %s FOR %s TO %s%s%s',
                       p.policyname, p.permissive, p.cmd,
                       (SELECT string_agg(quote_ident(r), ', ') FROM unnest(p.roles) r),
                       CASE WHEN p.qual IS NULL THEN '' ELSE ' USING (' || p.qual || ')' END,
                       CASE WHEN p.with_check IS NULL THEN ''
                            ELSE ' WITH CHECK (' || p.with_check || ')' END);
        EXECUTE format('DROP POLICY %I ON event_log_default', p.policyname);
    END LOOP;
    FOR g IN SELECT a.grantee::regrole AS grantee, a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'event_log_default'::regclass AND a.grantee <> c.relowner
               AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON event_log TO %s', g.privilege_type, g.grantee);
        EXECUTE format('REVOKE %s ON event_log_default FROM %s', g.privilege_type, g.grantee);
    END LOOP;
END;
$$;
ALTER TABLE event_log_default DISABLE ROW LEVEL SECURITY;

-- The views bound to the old table (by its identity, not its name) now read the parent.
DO $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT DISTINCT c.oid, c.reloptions
             FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
             JOIN pg_class c ON c.oid = r.ev_class
             WHERE d.refobjid = 'event_log_default'::regclass AND c.relkind = 'v' LOOP
        EXECUTE format('CREATE OR REPLACE VIEW %s %s AS %s', v.oid::regclass,
                       CASE WHEN v.reloptions IS NULL THEN ''
                            ELSE 'WITH (' || array_to_string(v.reloptions, ', ') || ')' END,
                       replace(pg_get_viewdef(v.oid), 'event_log_default', 'event_log'));
    END LOOP;
END;
$$;

-- The smallest UUIDv7 of an instant: its Unix milliseconds, then zeros.
CREATE FUNCTION uuid7_floor(at timestamptz) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid
$$;

-- Creating a partition scans the default one under a lock that pauses inserts: the
-- migration makes three years ahead while the default partition is not attached yet,
-- and the worker's retention pass keeps two years ahead, one month at a time.
-- Makes the partition of the calendar month (UTC) of `month`, with its unique keys and
-- its own TRUNCATE trigger, unless it exists or the default partition already holds
-- rows of its range (an older random id that happens to fall there: the month's cases
-- then stay in the default partition); says whether it made it.
CREATE FUNCTION event_log_make_partition(month timestamptz) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
$$;

-- The months from last month to `months_ahead` ahead; returns how many it made now.
CREATE FUNCTION event_log_prepare_partitions(months_ahead integer DEFAULT 24)
    RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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

-- Three years of months, made before the default partition is attached (no scan of it
-- each), then the old log attached as the default: one scan, here.
SELECT event_log_prepare_partitions(36);
ALTER TABLE event_log ATTACH PARTITION event_log_default DEFAULT;

-- Drops each month's partition that ended at least the floor's days ago and holds only
-- CASE_EXPIRED rows of expired cases (tombstoned, case row gone) that no hold keeps;
-- those rows move to the default partition first. Returns the partitions dropped.
CREATE FUNCTION event_log_drop_expired_partitions() RETURNS text[]
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
$$;

-- Only the roles setup names may call these (the worker's retention pass).
REVOKE EXECUTE ON FUNCTION event_log_prepare_partitions(integer),
    event_log_make_partition(timestamptz), event_log_drop_expired_partitions() FROM PUBLIC;
