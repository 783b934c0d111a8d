-- casetrail schema, version 26: what the retention journal holds that the database does
-- not (docs/operations.md, "Retention and legal holds").
--
-- Holds, releases, policy versions, approvals, business dates and erasures are also
-- published to the stream <ns>.retention-journal before they are made, where restoring
-- an older backup cannot undo them. This function names the journal entries (a JSON
-- array, as the stream holds them) the database lacks: `casetrail setup` makes them
-- again, and the workers' retention pass does not run while any is missing. An erasure
-- of a held case counts as made (the hold refuses it; it is made once the hold ends).
CREATE FUNCTION journal_missing(p_entries jsonb) RETURNS SETOF integer
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT (j.ordinality - 1)::int
    FROM jsonb_array_elements(p_entries) WITH ORDINALITY AS j(e, ordinality)
    WHERE NOT CASE j.e ->> 'kind'
        WHEN 'policy' THEN EXISTS (
            SELECT 1 FROM retention_policies p WHERE p.tenant_id = j.e ->> 'tenantId'
            AND p.agent = j.e ->> 'agent' AND p.version = (j.e ->> 'version')::int)
        WHEN 'approval' THEN EXISTS (
            SELECT 1 FROM retention_approvals a JOIN retention_policies p USING (policy_id)
            WHERE p.tenant_id = j.e ->> 'tenantId' AND p.agent = j.e ->> 'agent'
            AND p.version = (j.e ->> 'version')::int)
        WHEN 'businessDate' THEN EXISTS (
            SELECT 1 FROM retention_business_dates d WHERE d.tenant_id = j.e ->> 'tenantId'
            AND d.field = j.e ->> 'field' AND d.value = j.e ->> 'value'
            AND d.set_at = (j.e ->> 'setAt')::timestamptz)
        WHEN 'hold' THEN EXISTS (
            SELECT 1 FROM legal_holds h WHERE h.hold_id = (j.e ->> 'holdId')::uuid)
        WHEN 'release' THEN EXISTS (
            SELECT 1 FROM legal_hold_releases r WHERE r.hold_id = (j.e ->> 'holdId')::uuid
            AND r.person = j.e ->> 'person')
        WHEN 'erasure' THEN NOT EXISTS (
            SELECT 1 FROM case_secrets s WHERE s.case_id = (j.e ->> 'caseId')::uuid
            AND s.erased_at IS NULL) OR case_held((j.e ->> 'caseId')::uuid, j.e ->> 'tenantId')
        ELSE false END
$$;
REVOKE EXECUTE ON FUNCTION journal_missing(jsonb) FROM PUBLIC;
