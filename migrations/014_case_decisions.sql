-- casetrail schema, version 14: decisions and their checks, for people writing SQL and
-- for GET /cases?checks=failed.
--
-- A case's terminal event carries the agent's checks ("checks": [{name, version,
-- passed, blocking, detail}]); the consumer keeps it in cases.outcome. Whether any
-- check failed is a stored column (as the decision is, migration 008: under row-level
-- security only leakproof comparisons may use an index), with an index of its own.
ALTER TABLE cases ADD COLUMN checks_failed boolean GENERATED ALWAYS AS (
    jsonb_path_exists(outcome, '$.checks[*] ? (@.passed == false)')) STORED;
CREATE INDEX cases_search_checks_failed ON cases
    (tenant_id, created_at DESC, case_id DESC) WHERE checks_failed;

-- One row per ended case: who decided what, on which agent version and model, and how
-- its checks went. Runs with the reader's rights, so a tenant's SQL reader sees its
-- own rows only (row-level security on event_log, migration 004).
CREATE VIEW case_decisions WITH (security_invoker = true) AS
SELECT t.case_id,
       t.tenant_id,
       s.payload ->> 'agent'                                  AS agent,
       s.payload ->> 'agentVersion'                           AS agent_version,
       t.event_type                                           AS terminal_event,
       t.payload -> 'answer' ->> 'decision'                   AS decision,
       CASE WHEN t.payload ? 'answer'
            THEN coalesce(t.payload ->> 'decidedBy', 'agent') END AS decided_by,
       t.payload ->> 'reasonCode'                             AS reason_code,
       (SELECT count(*) FROM jsonb_array_elements(coalesce(t.payload -> 'checks', '[]'))
        AS c(check_result) WHERE (c.check_result ->> 'passed')::boolean)::int AS checks_passed,
       (SELECT count(*) FROM jsonb_array_elements(coalesce(t.payload -> 'checks', '[]'))
        AS c(check_result) WHERE NOT (c.check_result ->> 'passed')::boolean)::int
                                                              AS checks_failed,
       ARRAY(SELECT c.check_result ->> 'name'
             FROM jsonb_array_elements(coalesce(t.payload -> 'checks', '[]'))
             AS c(check_result) WHERE NOT (c.check_result ->> 'passed')::boolean)
                                                              AS failed_checks,
       s.payload -> 'model' ->> 'provider'                    AS model_provider,
       s.payload -> 'model' ->> 'name'                        AS model_name,
       t.occurred_at                                          AS ended_at
FROM event_log t
JOIN event_log s ON s.case_id = t.case_id AND s.attempt = t.attempt AND s.seq = 0
WHERE t.event_type IN ('CASE_COMPLETED', 'CASE_FAILED', 'CASE_TIMED_OUT', 'CASE_CANCELLED');
