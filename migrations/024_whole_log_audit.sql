-- casetrail schema, version 24: the whole log audited (docs/design.md, "One command
-- audits the whole log").
--
-- Each leaf says what kind of record it stands for, so that `casetrail audit` knows
-- what it must match: today every leaf is an event of event_log; a retention or a
-- backtest record will be a kind of its own. Existing leaves are events.
ALTER TABLE ledger_leaves ADD COLUMN kind text NOT NULL DEFAULT 'event'
    CONSTRAINT ledger_leaves_kind CHECK (kind IN ('event'));

-- Each audit pass, kept for good: how far it read the log (leaves below to_leaf), how
-- many cases it verified and what it found. The next pass goes on from the last one.
CREATE TABLE audit_runs (
    run_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    full_pass     boolean NOT NULL,
    from_leaf     bigint NOT NULL CHECK (from_leaf >= 0),
    to_leaf       bigint NOT NULL CHECK (to_leaf >= from_leaf),
    cases_checked integer NOT NULL,
    findings      jsonb NOT NULL
);
CREATE TRIGGER audit_runs_append_only BEFORE UPDATE OR DELETE ON audit_runs
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER audit_runs_no_truncate BEFORE TRUNCATE ON audit_runs
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
