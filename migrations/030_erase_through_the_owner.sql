-- casetrail schema, version 30: a person's erasure through the owner's function, as
-- retention's (docs/design.md, "Trust").
--
-- The API erased a case's sensitive values with its own UPDATE on case_secrets and
-- DELETE on case_keys: with the API's database password alone, anyone could destroy
-- any case's personal data, or delete its business keys, row by row. Now both erasures
-- (a person's, through the API; retention's, through the worker) run the owner's
-- erase_personal_data(), which erases only the whole case at once (the key and
-- ciphertext destroyed, who and when kept, the digests of its sensitive keys gone) and
-- which the legal-hold trigger on case_secrets still refuses for a held case. The API
-- loses its UPDATE on case_secrets and DELETE on case_keys (service/ops/setup.py).
CREATE FUNCTION erase_personal_data(p_case uuid, p_by text) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    erased timestamptz;
BEGIN
    IF p_by IS NULL OR length(p_by) NOT BETWEEN 1 AND 300 THEN
        RAISE EXCEPTION 'an erasure names who erased (1 to 300 characters)'
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE case_secrets SET wrapped_key = NULL, ciphertext = NULL, erased_at = now(),
                            erased_by = p_by
    WHERE case_id = p_case AND erased_at IS NULL RETURNING erased_at INTO erased;
    IF erased IS NOT NULL THEN
        DELETE FROM case_keys WHERE case_id = p_case AND digest;
    END IF;
    RETURN erased;
END;
$$;

CREATE OR REPLACE FUNCTION erase_for_retention(p_case uuid, p_by text) RETURNS timestamptz
    LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT erase_personal_data(p_case, p_by)
$$;

REVOKE EXECUTE ON FUNCTION erase_personal_data(uuid, text) FROM PUBLIC;
