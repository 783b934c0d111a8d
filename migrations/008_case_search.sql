-- casetrail schema, version 8: indexes for case search (GET /cases).
--
-- A search is always within one tenant, newest first, and pages with a
-- (created_at, case_id) cursor; each filter it offers has an index whose leading
-- columns are equality on the tenant and the filter, then the sort order, so a
-- page is a short index range scan however many cases the tenant has:
--   no filter / time range only  -> cases_search_recent
--   agent (+ status)             -> cases_search_agent   (the other filtered on the way)
--   status (+ agent)             -> cases_search_status
--   decision                     -> cases_search_decision (only cases that have one)
--   agent + decision             -> cases_search_agent_decision (decisions are per agent:
--                                   a combination that matches nothing is found at once)
-- Postgres picks the most selective; docs/benchmarks.md has the page times at 1M cases.
--
-- The decision is a stored column derived from the answer, not an index on the
-- expression: the API reads `cases` under row-level security, where only leakproof
-- comparisons may be index conditions, and `answer ->> 'decision'` is not one (the
-- expression index went unused and a decision search read the whole tenant).
-- Adding the column rewrites `cases` once.
ALTER TABLE cases ADD COLUMN decision text GENERATED ALWAYS AS (answer ->> 'decision') STORED;
CREATE INDEX cases_search_recent ON cases (tenant_id, created_at DESC, case_id DESC);
CREATE INDEX cases_search_agent ON cases (tenant_id, agent, created_at DESC, case_id DESC);
CREATE INDEX cases_search_status ON cases (tenant_id, status, created_at DESC, case_id DESC);
CREATE INDEX cases_search_decision ON cases
    (tenant_id, decision, created_at DESC, case_id DESC) WHERE decision IS NOT NULL;
CREATE INDEX cases_search_agent_decision ON cases
    (tenant_id, agent, decision, created_at DESC, case_id DESC) WHERE decision IS NOT NULL;

-- Superseded: the quota's "started in the last minute" count reads cases_search_recent,
-- and every status lookup is within a tenant.
DROP INDEX cases_tenant_created;
DROP INDEX cases_status;

-- Room on each page for a case's row to be updated in place: the lease and the totals
-- change many times a case without touching an indexed column, and such an update is
-- "heap-only" (no index entry written) only when its page has space for the new version.
ALTER TABLE cases SET (fillfactor = 70);
