-- casetrail schema, version 10: the safety net for cases nobody runs.
--
-- A case whose lease lapsed without a terminal event (its worker died, or handed it
-- back, and its start command was lost with a broker node) is found by a worker's
-- sweeper, which sends its start command again. `start_resent_at` is when it last
-- did, so one stranded case is re-sent once a sweep interval, not on every sweep.
-- The sweep reads the active cases through `cases_tenant_active` (migration 005).
ALTER TABLE cases ADD COLUMN start_resent_at timestamptz;
