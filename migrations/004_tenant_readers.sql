-- casetrail schema, version 4: SQL readers that see only their tenant's rows.
--
-- `casetrail sql-role create --tenant T` makes a login role per tenant and records it
-- here. Row-level security then shows that role only its tenant's rows of event_log
-- and cases, and the views run with the reader's rights (security_invoker), so they
-- cannot be used to read around it. Roles that own the tables, and superusers, are
-- not subject to it.

CREATE TABLE tenant_readers (
    role_name  text        PRIMARY KEY,
    tenant_id  text        NOT NULL CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The tenant of the role that logged in (session_user: inside this function
-- current_user is its owner). NULL for anyone who is not a registered reader.
CREATE FUNCTION reader_tenant() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$ SELECT tenant_id FROM public.tenant_readers WHERE role_name = session_user $$;

ALTER TABLE event_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE cases ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_reader ON event_log FOR SELECT USING (tenant_id = reader_tenant());
CREATE POLICY tenant_reader ON cases FOR SELECT USING (tenant_id = reader_tenant());

ALTER VIEW react_cycles SET (security_invoker = true);
ALTER VIEW react_tool_calls SET (security_invoker = true);
