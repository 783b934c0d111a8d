-- casetrail schema, version 23: an operator's acceptance of the log's size (docs/design.md,
-- "The log knows how far it has been"). The ledger keeps its high-water mark off its
-- database; when both of its anchors are lost, it signs again only after an operator
-- accepts a size here, with a reason, by `casetrail ledger accept-size`. Kept for good:
-- an auditor sees every time the log's memory of itself was replaced by a person's word.
CREATE TABLE ledger_acceptances (
    accepted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    tree_size    bigint NOT NULL CHECK (tree_size >= 0),
    root_hash    bytea NOT NULL CHECK (length(root_hash) = 32),
    note         text NOT NULL,
    reason       text NOT NULL CHECK (length(btrim(reason)) > 0),
    accepted_by  text NOT NULL
);
CREATE TRIGGER ledger_acceptances_append_only BEFORE UPDATE OR DELETE ON ledger_acceptances
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_acceptances_no_truncate BEFORE TRUNCATE ON ledger_acceptances
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
