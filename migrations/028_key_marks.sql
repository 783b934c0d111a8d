-- casetrail schema, version 28: a business-key hold reaches an erased or expired case
-- (docs/design.md, "Keeping records as long as the law says").
--
-- Erasing a case deletes the keyed digests of its sensitive business keys from
-- case_keys, so that a search can no longer test a guessed value against them; and an
-- expiry deletes all of its keys. A legal hold on a business key ("every case of
-- customer C-1001") must still find such a case. Each deleted digest is therefore kept
-- here (a keyed digest, never the value), read only by the holds' checks.
CREATE TABLE case_key_marks (
    case_id   uuid NOT NULL,
    tenant_id text NOT NULL,
    field     text NOT NULL,
    digest    text NOT NULL,
    PRIMARY KEY (case_id, field)
);
CREATE INDEX case_key_marks_by_digest ON case_key_marks (tenant_id, field, digest);

CREATE FUNCTION case_keys_marked() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO case_key_marks (case_id, tenant_id, field, digest)
    VALUES (OLD.case_id, OLD.tenant_id, OLD.field, OLD.value) ON CONFLICT DO NOTHING;
    RETURN OLD;
END;
$$;
CREATE TRIGGER case_keys_marked AFTER DELETE ON case_keys
    FOR EACH ROW WHEN (OLD.digest) EXECUTE FUNCTION case_keys_marked();
ALTER TABLE case_keys ENABLE ALWAYS TRIGGER case_keys_marked;

CREATE OR REPLACE FUNCTION case_held(p_case uuid, p_tenant text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
