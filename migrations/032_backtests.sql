-- casetrail schema, version 32: backtests on the record (docs/backtests.md).
--
-- A backtest is asked for (`backtests`: what to run, by whom, how far it got), run by a
-- worker, and kept as evidence: its per-case results (`backtest_results`) and one signed
-- record (`backtest_records`) naming the agent digests, the model, the selection, the
-- tool-answer policy and a digest of every result. Records form one chain, each naming
-- the hash of the one before (the database checks it), and each enters the
-- transparency log as a leaf of the kind 'backtest'. Results and records are never
-- changed or deleted. Nothing here touches event_log or the case tables.

ALTER TABLE ledger_queue ADD COLUMN kind text NOT NULL DEFAULT 'event'
    CHECK (kind IN ('event', 'backtest'));
ALTER TABLE ledger_leaves DROP CONSTRAINT ledger_leaves_kind;
ALTER TABLE ledger_leaves ADD CONSTRAINT ledger_leaves_kind
    CHECK (kind IN ('event', 'backtest'));

CREATE TABLE backtests (
    backtest_id      uuid PRIMARY KEY,
    tenant_id        text,  -- NULL: every tenant's cases (an operator's command)
    agent            text NOT NULL,
    request          jsonb NOT NULL,
    requested_by     text NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    status           text NOT NULL DEFAULT 'queued'
        CHECK (status = ANY (ARRAY['queued', 'running', 'done', 'failed'])),
    runner           text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    cases_done       integer NOT NULL DEFAULT 0,
    cases_selected   integer,
    problem          text,
    finished_at      timestamptz
);
CREATE INDEX backtests_waiting ON backtests (requested_at) WHERE status IN ('queued', 'running');
CREATE INDEX backtests_of_tenant ON backtests (tenant_id, requested_at);

CREATE TABLE backtest_results (
    backtest_id uuid    NOT NULL REFERENCES backtests,
    position    integer NOT NULL CHECK (position >= 0),
    case_id     uuid    NOT NULL,
    result      jsonb   NOT NULL,
    digest      text    NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (backtest_id, position)
);

CREATE TABLE backtest_records (
    backtest_id uuid        PRIMARY KEY REFERENCES backtests,
    chain_seq   bigint      NOT NULL UNIQUE CHECK (chain_seq >= 0),
    body        bytea       NOT NULL,
    prev_hash   text        NOT NULL CHECK (prev_hash ~ '^[0-9a-f]{64}$'),
    hash        text        NOT NULL UNIQUE CHECK (hash ~ '^[0-9a-f]{64}$'),
    key_id      text        NOT NULL,
    sig         text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- A record names the hash of the one before it (the first names sixty-four zeros),
-- so none can be slipped in, dropped or reordered without the chain showing it.
CREATE FUNCTION backtest_record_chains() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
CREATE TRIGGER backtest_records_chain BEFORE INSERT ON backtest_records
    FOR EACH ROW EXECUTE FUNCTION backtest_record_chains();

CREATE FUNCTION backtest_record_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash, kind)
    VALUES (NEW.backtest_id, NEW.backtest_id, NEW.hash, 'backtest');
    RETURN NULL;
END;
$$;
CREATE TRIGGER backtest_records_enter_ledger AFTER INSERT ON backtest_records
    FOR EACH ROW EXECUTE FUNCTION backtest_record_enters_ledger();

CREATE TRIGGER backtest_results_append_only BEFORE UPDATE OR DELETE ON backtest_results
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER backtest_results_no_truncate BEFORE TRUNCATE ON backtest_results
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER backtest_records_append_only BEFORE UPDATE OR DELETE ON backtest_records
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER backtest_records_no_truncate BEFORE TRUNCATE ON backtest_records
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
ALTER TABLE backtest_records ENABLE ALWAYS TRIGGER backtest_records_chain;
ALTER TABLE backtest_records ENABLE ALWAYS TRIGGER backtest_records_enter_ledger;
ALTER TABLE backtest_records ENABLE ALWAYS TRIGGER backtest_records_append_only;
ALTER TABLE backtest_records ENABLE ALWAYS TRIGGER backtest_records_no_truncate;
ALTER TABLE backtest_results ENABLE ALWAYS TRIGGER backtest_results_append_only;
ALTER TABLE backtest_results ENABLE ALWAYS TRIGGER backtest_results_no_truncate;
REVOKE EXECUTE ON FUNCTION backtest_record_chains(), backtest_record_enters_ledger()
    FROM PUBLIC;
