-- casetrail schema, version 5: indexes for the per-tenant quotas checked on every
-- POST /cases (cases queued or running, cases started in the last minute).
CREATE INDEX cases_tenant_active ON cases (tenant_id) WHERE status IN ('queued', 'running');
CREATE INDEX cases_tenant_created ON cases (tenant_id, created_at);
