-- casetrail schema, version 8: indexes for case search (GET /cases).
--
-- A search is always within one tenant, newest first, and pages with a
-- (created_at, case_id) cursor; each filter it offers has an index whose leading
-- columns are equality on the tenant and the filter, then the sort order, so a
-- page is a short index range scan however many cases the tenant has:
--   no filter / time range only  -> cases_search_recent
--   agent (+ status, decision)   -> cases_search_agent   (others filtered on the way)
--   status (+ agent)             -> cases_search_status
--   decision (+ agent)           -> cases_search_decision (only cases that have one)
-- Postgres picks the most selective; docs/benchmarks.md has the page times at 1M cases.
CREATE INDEX cases_search_recent ON cases (tenant_id, created_at DESC, case_id DESC);
CREATE INDEX cases_search_agent ON cases (tenant_id, agent, created_at DESC, case_id DESC);
CREATE INDEX cases_search_status ON cases (tenant_id, status, created_at DESC, case_id DESC);
CREATE INDEX cases_search_decision ON cases
    (tenant_id, (answer ->> 'decision'), created_at DESC, case_id DESC)
    WHERE answer ->> 'decision' IS NOT NULL;

-- Superseded: the quota's "started in the last minute" count reads cases_search_recent,
-- and every status lookup is within a tenant.
DROP INDEX cases_tenant_created;
DROP INDEX cases_status;
