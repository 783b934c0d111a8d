-- casetrail schema, version 6: the append-only triggers fire always.
--
-- A session with session_replication_role = replica (what logical-replication
-- tools set) skips ordinary triggers; ENABLE ALWAYS makes the refusal of UPDATE,
-- DELETE and TRUNCATE on the log hold there too. Who may do what is granted per
-- component by `casetrail setup` (service/setup.py), after these files ran as the
-- owner role.
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_update_or_delete;
ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_truncate;
