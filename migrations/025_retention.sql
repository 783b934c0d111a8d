-- casetrail schema, version 25: retention, legal holds and expiry that leaves proof
-- (docs/design.md, "Keeping records as long as the law says").
--
-- The default is to keep everything: no policy, nothing expires. A policy says, per
-- tenant and within it per agent, how long a decided case is kept and how long its
-- personal data is; a case whose time is up and that no hold keeps gets a signed,
-- chained CASE_EXPIRED (appended by the worker), which this file's trigger copies into
-- a tombstone; only then may the owner's function expire_case() delete its events and
-- its case row. Every leaf stays in the transparency log, so `verify` and `casetrail
-- audit` check an expired case against its tombstone instead of calling it tampering.

ALTER TABLE event_log DROP CONSTRAINT event_log_event_type_check;
ALTER TABLE event_log ADD CONSTRAINT event_log_event_type_check CHECK (event_type IN (
    'CASE_STARTED', 'REACT_CYCLE', 'CASE_COMPLETED', 'CASE_FAILED',
    'CASE_TIMED_OUT', 'CASE_CANCELLED', 'CASE_ERASED',
    'CASE_AWAITING_REVIEW', 'CASE_REVIEWED', 'CASE_EXPIRED')) NOT VALID;
ALTER TABLE event_log VALIDATE CONSTRAINT event_log_event_type_check;

-- The floor no policy goes below, kept where only the owner writes (no component is
-- granted anything here): six months, the AI Act's minimum for the logs of high-risk
-- systems. Raising it is the owner's act; lowering it below six months needs a
-- migration.
CREATE TABLE retention_floor (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    min_days integer NOT NULL CHECK (min_days >= 183),
    source   text    NOT NULL
);
INSERT INTO retention_floor VALUES (true, 183, 'EU AI Act Art. 19 and Art. 26(6): logs of '
    'high-risk AI systems kept for at least six months');

-- Every row a person's act writes here carries what the API's action key signed
-- (`action`): the worker deletes nothing on a policy, an approval or a release whose
-- signature does not hold (casetrail.trail.retention_actions).
--
-- Policies, versioned and append-only: each change is a new row (who, why, when). A
-- change that shortens what is kept (a first policy after "keep everything" does) is
-- in force only once a second person approved it (retention_approvals); the trigger
-- below decides that, not the caller.
CREATE TABLE retention_policies (
    policy_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text        NOT NULL,
    agent              text        NOT NULL DEFAULT '*' CHECK (length(agent) BETWEEN 1 AND 100),
    version            integer     NOT NULL CHECK (version >= 1),
    keep_days          integer     CHECK (keep_days >= 1),
    counted_from       text        NOT NULL DEFAULT 'ended'
        CHECK (counted_from IN ('ended', 'business_date')),
    business_key       text        CHECK (length(business_key) BETWEEN 1 AND 100),
    personal_data_days integer     CHECK (personal_data_days >= 1),
    archive            boolean     NOT NULL DEFAULT false,
    preset             text,
    reason             text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000),
    set_by             text        NOT NULL,
    set_at             timestamptz NOT NULL DEFAULT now(),
    needs_second       boolean     NOT NULL DEFAULT false,
    action             jsonb,
    UNIQUE (tenant_id, agent, version),
    CHECK (personal_data_days IS NULL OR keep_days IS NULL OR personal_data_days <= keep_days),
    CHECK ((counted_from = 'business_date') = (business_key IS NOT NULL))
);

CREATE TABLE retention_approvals (
    policy_id   bigint      PRIMARY KEY REFERENCES retention_policies,
    approved_by text        NOT NULL,
    approved_at timestamptz NOT NULL DEFAULT now(),
    action      jsonb
);

-- The policy in force for (tenant, agent): the newest version that needs no second
-- person or has one. Agent '*' is the tenant's default.
CREATE VIEW retention_in_force AS
SELECT DISTINCT ON (p.tenant_id, p.agent) p.*
FROM retention_policies p
WHERE NOT p.needs_second
   OR EXISTS (SELECT 1 FROM retention_approvals a WHERE a.policy_id = p.policy_id)
ORDER BY p.tenant_id, p.agent, p.version DESC;

CREATE FUNCTION retention_policy_checked() RETURNS trigger
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
    -- Keeping less than before, or deleting where everything was kept: two persons.
    NEW.needs_second := (NEW.keep_days IS NOT NULL
                         AND (current.policy_id IS NULL OR current.keep_days IS NULL
                              OR NEW.keep_days < current.keep_days))
                     OR (NEW.personal_data_days IS NOT NULL
                         AND (current.policy_id IS NULL OR current.personal_data_days IS NULL
                              OR NEW.personal_data_days < current.personal_data_days))
                     OR (current.policy_id IS NOT NULL
                         AND NEW.counted_from IS DISTINCT FROM current.counted_from);
    RETURN NEW;
END;
$$;
CREATE TRIGGER retention_policy_checked BEFORE INSERT ON retention_policies
    FOR EACH ROW EXECUTE FUNCTION retention_policy_checked();

CREATE FUNCTION retention_approval_checked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM retention_policies p WHERE p.policy_id = NEW.policy_id
               AND p.set_by = NEW.approved_by) THEN
        RAISE EXCEPTION 'the person who set a policy does not approve it (two persons)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER retention_approval_checked BEFORE INSERT ON retention_approvals
    FOR EACH ROW EXECUTE FUNCTION retention_approval_checked();

-- When a customer relationship (or whatever a business key names) ended: the date a
-- policy counted from 'business_date' counts from. Append-only; the newest counts.
CREATE TABLE retention_business_dates (
    tenant_id text        NOT NULL,
    field     text        NOT NULL CHECK (length(field) BETWEEN 1 AND 100),
    value     text        NOT NULL CHECK (length(value) BETWEEN 1 AND 300),
    ended_on  date        NOT NULL,
    set_by    text        NOT NULL,
    set_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant_id, field, value, set_at)
);

-- Legal holds on a case, on a business key (every case with it, present and future)
-- or on a whole tenant. Append-only: a hold ends at ends_at, or once two persons have
-- released it (two rows in legal_hold_releases).
CREATE TABLE legal_holds (
    hold_id   uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id text        NOT NULL,
    scope     text        NOT NULL CHECK (scope IN ('case', 'business_key', 'tenant')),
    case_id   uuid,
    key_field text        CHECK (length(key_field) BETWEEN 1 AND 100),
    key_value text        CHECK (length(key_value) BETWEEN 1 AND 300),
    reason    text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000),
    ends_at   timestamptz,
    placed_by text        NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    action    jsonb,
    CHECK ((scope = 'case') = (case_id IS NOT NULL)),
    CHECK ((scope = 'business_key') = (key_field IS NOT NULL AND key_value IS NOT NULL))
);
CREATE INDEX legal_holds_tenant ON legal_holds (tenant_id, placed_at);
CREATE INDEX legal_holds_case ON legal_holds (case_id) WHERE case_id IS NOT NULL;

CREATE TABLE legal_hold_releases (
    hold_id     uuid        NOT NULL REFERENCES legal_holds,
    person      text        NOT NULL,
    reason      text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000),
    released_at timestamptz NOT NULL DEFAULT now(),
    action      jsonb,
    PRIMARY KEY (hold_id, person)
);

-- Whether a hold keeps the case now.
CREATE FUNCTION case_held(p_case uuid, p_tenant text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM legal_holds h
        WHERE h.tenant_id = p_tenant
          AND (h.ends_at IS NULL OR h.ends_at > now())
          AND (SELECT count(*) FROM legal_hold_releases r WHERE r.hold_id = h.hold_id) < 2
          AND (h.scope = 'tenant'
               OR (h.scope = 'case' AND h.case_id = p_case)
               OR (h.scope = 'business_key' AND EXISTS (
                       SELECT 1 FROM case_keys k WHERE k.case_id = p_case
                       AND k.field = h.key_field AND k.value = h.key_value))))
$$;

-- What a CASE_EXPIRED said, kept apart from the log (never partitioned, never
-- deleted): the policy, the number of events removed and each attempt's final chain
-- hash, so that the log's leaves still check after the bodies are gone.
CREATE TABLE case_tombstones (
    case_id        uuid        PRIMARY KEY,
    tenant_id      text        NOT NULL,
    event_id       uuid        NOT NULL UNIQUE,
    event_hash     text        NOT NULL CHECK (event_hash ~ '^[0-9a-f]{64}$'),
    policy_id      bigint      NOT NULL,
    policy_version integer     NOT NULL,
    events_removed integer     NOT NULL CHECK (events_removed >= 1),
    heads          jsonb       NOT NULL,
    expired_by     text        NOT NULL,
    expired_at     timestamptz NOT NULL
);

-- Each stored event still enters the ledger's queue; a stored CASE_EXPIRED also
-- leaves its tombstone, in the same statement (no writer of event_log can skip it).
CREATE OR REPLACE FUNCTION event_log_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash)
    SELECT event_id, case_id, hash FROM stored WHERE hash IS NOT NULL
    ORDER BY case_id, attempt, seq;
    INSERT INTO case_tombstones (case_id, tenant_id, event_id, event_hash, policy_id,
                                 policy_version, events_removed, heads, expired_by,
                                 expired_at)
    SELECT case_id, tenant_id, event_id, hash, (payload ->> 'policyId')::bigint,
           (payload ->> 'policyVersion')::int, (payload ->> 'eventsRemoved')::int,
           payload -> 'heads', payload ->> 'expiredBy', occurred_at
    FROM stored WHERE event_type = 'CASE_EXPIRED'
    ON CONFLICT (case_id) DO NOTHING;
    RETURN NULL;
END;
$$;

-- The log refuses UPDATE and TRUNCATE always, and DELETE but of a tombstoned case that
-- no hold keeps (its CASE_EXPIRED itself stays).
CREATE OR REPLACE FUNCTION event_log_append_only() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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

-- A case row goes only before anything of it was logged (the API withdraws a start it
-- could not publish), or with its expiry.
CREATE FUNCTION cases_kept() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = OLD.case_id
                   AND e.event_type <> 'CASE_EXPIRED') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'case % has a trail: it goes only with its expiry', OLD.case_id;
END;
$$;
CREATE TRIGGER cases_kept BEFORE DELETE ON cases
    FOR EACH ROW EXECUTE FUNCTION cases_kept();
ALTER TABLE cases ENABLE ALWAYS TRIGGER cases_kept;

-- Personal data of a held case is not erased (the case's evidence is frozen).
CREATE FUNCTION case_secrets_not_held() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NEW.erased_at IS NOT NULL AND OLD.erased_at IS NULL AND case_held(
            OLD.case_id, (SELECT tenant_id FROM cases WHERE case_id = OLD.case_id)) THEN
        RAISE EXCEPTION 'case % is under a legal hold: its values are not erased',
            OLD.case_id USING ERRCODE = 'CTHLD';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER case_secrets_not_held BEFORE UPDATE ON case_secrets
    FOR EACH ROW EXECUTE FUNCTION case_secrets_not_held();
ALTER TABLE case_secrets ENABLE ALWAYS TRIGGER case_secrets_not_held;

-- Expiry: the one way a trail's events go. Checks, in the database, the tombstone,
-- that no hold applies and that the ledger has logged every event; then deletes the
-- events (but CASE_EXPIRED) and the case row with its secrets, keys and actions.
CREATE FUNCTION expire_case(p_case uuid) RETURNS integer
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

-- The API withdraws a case whose start command could not be published, and nothing
-- else (it no longer deletes from cases itself).
CREATE FUNCTION withdraw_case(p_case uuid) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH gone AS (DELETE FROM cases WHERE case_id = p_case AND attempts_claimed = 0
                  RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

-- Retention erases a case's personal data on its policy's earlier deadline, as
-- `erase` does (the key and ciphertext destroyed, who kept), through this function.
CREATE FUNCTION erase_for_retention(p_case uuid, p_by text) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    erased timestamptz;
BEGIN
    UPDATE case_secrets SET wrapped_key = NULL, ciphertext = NULL, erased_at = now(),
                            erased_by = p_by
    WHERE case_id = p_case AND erased_at IS NULL RETURNING erased_at INTO erased;
    IF erased IS NOT NULL THEN
        DELETE FROM case_keys WHERE case_id = p_case AND digest;
    END IF;
    RETURN erased;
END;
$$;

REVOKE EXECUTE ON FUNCTION case_held(uuid, text), expire_case(uuid), withdraw_case(uuid),
    erase_for_retention(uuid, text) FROM PUBLIC;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['retention_policies', 'retention_approvals',
                             'retention_business_dates', 'legal_holds', 'legal_hold_releases',
                             'case_tombstones'] LOOP
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW '
                       'EXECUTE FUNCTION append_only()', t || '_append_only', t);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                       'EXECUTE FUNCTION append_only()', t || '_no_truncate', t);
        EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER %I', t, t || '_append_only');
        EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER %I', t, t || '_no_truncate');
    END LOOP;
END;
$$;
