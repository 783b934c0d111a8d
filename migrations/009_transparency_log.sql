-- casetrail schema, version 9: the transparency log (service/ledger/).
--
-- Every stored event's hash becomes a leaf of one append-only Merkle tree (RFC 6962
-- hashing). The consumer's insert puts each new event in `ledger_queue` in the same
-- transaction (a trigger, so no writer of `event_log` can skip it); the ledger, the
-- one sequencer, takes them from there in order, appends the leaves and the tiles
-- they change, and signs checkpoints, each batch in one transaction.

CREATE TABLE ledger_queue (
    queued_id bigserial PRIMARY KEY,
    event_id  uuid NOT NULL,
    case_id   uuid NOT NULL,
    hash      text NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$')
);

CREATE FUNCTION event_log_enters_ledger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO ledger_queue (event_id, case_id, hash)
    SELECT event_id, case_id, hash FROM stored WHERE hash IS NOT NULL
    ORDER BY case_id, attempt, seq;
    RETURN NULL;
END;
$$;
CREATE TRIGGER event_log_enters_ledger
    AFTER INSERT ON event_log REFERENCING NEW TABLE AS stored
    FOR EACH STATEMENT EXECUTE FUNCTION event_log_enters_ledger();
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_enters_ledger;

-- Leaf i of the tree is the event with leaf_index i. Never updated or deleted.
CREATE TABLE ledger_leaves (
    leaf_index bigint PRIMARY KEY CHECK (leaf_index >= 0),
    event_id   uuid   NOT NULL UNIQUE,
    case_id    uuid   NOT NULL
);
CREATE INDEX ledger_leaves_case ON ledger_leaves (case_id);

-- The tree as C2SP tlog-tiles of height 8: level L, index N holds the hashes of the
-- complete subtrees of height 8L numbered 256N ... (32 bytes each). A tile only grows.
CREATE TABLE ledger_tiles (
    level      smallint NOT NULL CHECK (level >= 0),
    tile_index bigint   NOT NULL CHECK (tile_index >= 0),
    hashes     bytea    NOT NULL
        CHECK (length(hashes) BETWEEN 32 AND 8192 AND length(hashes) % 32 = 0),
    PRIMARY KEY (level, tile_index)
);

-- Signed checkpoints (the signed note, verbatim), one per tree size. Never updated.
CREATE TABLE ledger_checkpoints (
    tree_size  bigint      PRIMARY KEY CHECK (tree_size >= 0),
    root_hash  bytea       NOT NULL CHECK (length(root_hash) = 32),
    note       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Witnesses' cosignatures of checkpoints (one signature line each), checked before
-- they are kept.
CREATE TABLE ledger_cosignatures (
    tree_size   bigint      NOT NULL REFERENCES ledger_checkpoints,
    witness     text        NOT NULL,
    line        text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tree_size, witness)
);

-- The log's verifier keys (c2sp.org/signed-note), as the ledger announced them.
CREATE TABLE ledger_keys (
    verifier_key text        PRIMARY KEY,
    origin       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END;
$$;
CREATE FUNCTION ledger_tile_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF length(NEW.hashes) < length(OLD.hashes)
       OR substring(NEW.hashes FROM 1 FOR length(OLD.hashes)) <> OLD.hashes
       OR NEW.level <> OLD.level OR NEW.tile_index <> OLD.tile_index THEN
        RAISE EXCEPTION 'tile %/% may only grow', OLD.level, OLD.tile_index;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER ledger_leaves_append_only BEFORE UPDATE OR DELETE ON ledger_leaves
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_leaves_no_truncate BEFORE TRUNCATE ON ledger_leaves
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_checkpoints_append_only BEFORE UPDATE OR DELETE ON ledger_checkpoints
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_checkpoints_no_truncate BEFORE TRUNCATE ON ledger_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_tiles_only_grow BEFORE UPDATE ON ledger_tiles
    FOR EACH ROW EXECUTE FUNCTION ledger_tile_only_grows();
CREATE TRIGGER ledger_tiles_no_delete BEFORE DELETE ON ledger_tiles
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_tiles_no_truncate BEFORE TRUNCATE ON ledger_tiles
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
ALTER TABLE ledger_leaves ENABLE ALWAYS TRIGGER ledger_leaves_append_only;
ALTER TABLE ledger_leaves ENABLE ALWAYS TRIGGER ledger_leaves_no_truncate;
ALTER TABLE ledger_checkpoints ENABLE ALWAYS TRIGGER ledger_checkpoints_append_only;
ALTER TABLE ledger_checkpoints ENABLE ALWAYS TRIGGER ledger_checkpoints_no_truncate;
ALTER TABLE ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_only_grow;
ALTER TABLE ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_no_delete;
ALTER TABLE ledger_tiles ENABLE ALWAYS TRIGGER ledger_tiles_no_truncate;

-- Events stored before the log existed enter it first, in the order they were stored.
INSERT INTO ledger_queue (event_id, case_id, hash)
SELECT event_id, case_id, hash FROM event_log WHERE hash IS NOT NULL
ORDER BY recorded_at, case_id, attempt, seq;
