-- casetrail schema, version 35: a business key names only its own case (docs/design.md,
-- "Served values").
--
-- The API's role inserted case_keys freely: with its database password alone, a
-- business key (an applicant id a reviewer searches by) could be pointed at another,
-- older case. Now a key is kept only in the transaction that makes its case, in that
-- case's tenant, for a field its input holds, and a key kept in clear from a text
-- field must be that field's value (as the API keeps it: its first 300 characters). A
-- sensitive one is a keyed digest the database cannot recompute, and a number's text is
-- Python's; the case's signed start binds its input either way. The check runs after the statement (a row trigger AFTER
-- INSERT sees the case the same statement inserted), for every inserter.
CREATE FUNCTION case_keys_with_their_case() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM cases c
                   WHERE c.case_id = NEW.case_id AND c.tenant_id = NEW.tenant_id
                     AND c.xmin = pg_current_xact_id()::xid
                     AND c.input ? NEW.field
                     AND (NEW.digest OR jsonb_typeof(c.input -> NEW.field) <> 'string'
                          OR left(c.input ->> NEW.field, 300) = NEW.value)) THEN
        RAISE EXCEPTION 'a business key is kept only with the case it names: made in the '
            'same transaction, in its tenant, the value its input holds (case %, field %)',
            NEW.case_id, NEW.field USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER case_keys_with_their_case AFTER INSERT ON case_keys
    FOR EACH ROW EXECUTE FUNCTION case_keys_with_their_case();
ALTER TABLE case_keys ENABLE ALWAYS TRIGGER case_keys_with_their_case;
