-- casetrail schema, version 34: personal data is erased only through the record
-- (docs/design.md, "Served values").
--
-- The API's role could run erase_personal_data(case, author) on any case of any tenant
-- with any author, and the worker's erase_for_retention() on a case no policy covered:
-- values shredded at once, no CASE_ERASED, the audit clean. Now no component may run
-- either (service/ops/setup.py grants neither): a case's values are shredded by the
-- owner's trigger in the statement that stores its CASE_ERASED, which the worker signs
-- on a person's erasure the API signed or on the tenant's policy deadline. Who and when
-- come from that event, never from a parameter. An erasure without its event, or an
-- event whose values are still kept, is an audit finding (`erasure_unrecorded`).
-- A case a legal hold keeps is not shredded (the hold trigger on case_secrets would
-- refuse it and with it the whole batch): its CASE_ERASED is stored, its values kept,
-- and the audit names it, so the rare race of a hold placed while an erasure travels
-- is seen and settled by a person.
CREATE FUNCTION event_log_erases_values() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
CREATE TRIGGER event_log_erases_values AFTER INSERT ON event_log
    REFERENCING NEW TABLE AS stored FOR EACH STATEMENT
    EXECUTE FUNCTION event_log_erases_values();
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_erases_values;

REVOKE EXECUTE ON FUNCTION erase_for_retention(uuid, text) FROM PUBLIC;
