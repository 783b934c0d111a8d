-- casetrail schema, version 37: audit runs are evidence too (docs/design.md, "One command
-- audits the whole log").
--
-- Each pass the audit keeps is a signed record: canonical JSON of what the pass did and
-- found (`body`), chained to the run before it (`prev_hash`, the first names sixty-four
-- zeros, the database checks it), hashed and signed as an event is, under the auditor's
-- own key (`audit_keys`, registered by an operator alone, as `signing_keys` is). A run
-- forged (unsigned, or under a key not registered), altered (its bytes or its columns)
-- or removed (a gap in the chain, or fewer runs than the auditor last kept, which it
-- remembers off the database) is a finding, and a pass believes the last run only when
-- it verifies. Runs are not leaves of the log: a log mended from bundles after a restore
-- could not have them back. Runs kept before this version have no body; the first pass
-- after it checks the whole log and starts the chain.

CREATE TABLE audit_keys (
    key_id          text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    public_key      bytea       NOT NULL CHECK (length(public_key) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    retired_at      timestamptz,
    not_valid_after timestamptz,
    CHECK ((retired_at IS NULL) = (not_valid_after IS NULL))
);

ALTER TABLE audit_runs
    ADD COLUMN chain_seq bigint UNIQUE CHECK (chain_seq >= 0),
    ADD COLUMN body      bytea,
    ADD COLUMN prev_hash text   CHECK (prev_hash ~ '^[0-9a-f]{64}$'),
    ADD COLUMN hash      text   UNIQUE CHECK (hash ~ '^[0-9a-f]{64}$'),
    ADD COLUMN key_id    text,
    ADD COLUMN sig       text,
    ADD CONSTRAINT audit_runs_signed CHECK (
        (body IS NULL) = (chain_seq IS NULL)
        AND (body IS NULL) = (prev_hash IS NULL) AND (body IS NULL) = (hash IS NULL)
        AND (body IS NULL) = (key_id IS NULL) AND (body IS NULL) = (sig IS NULL));

-- A new run is signed and follows the last signed one; none is slipped in, dropped or
-- reordered without the chain showing it.
CREATE FUNCTION audit_run_chains() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
CREATE TRIGGER audit_runs_chain BEFORE INSERT ON audit_runs
    FOR EACH ROW EXECUTE FUNCTION audit_run_chains();

ALTER TABLE audit_runs ENABLE ALWAYS TRIGGER audit_runs_chain;
ALTER TABLE audit_runs ENABLE ALWAYS TRIGGER audit_runs_append_only;
ALTER TABLE audit_runs ENABLE ALWAYS TRIGGER audit_runs_no_truncate;
REVOKE EXECUTE ON FUNCTION audit_run_chains() FROM PUBLIC;
