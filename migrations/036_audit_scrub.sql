-- casetrail schema, version 36: the audit's scrub (docs/design.md, "One command audits the whole log"): besides the
-- cases newly logged, each pass re-verifies stored cases in case-id order for a set
-- time, going on from where the last pass stopped, so the whole log is checked again
-- within a bounded period. A pass keeps where its scrub stopped, how many cases it
-- re-verified, and whether it came round to where it began (a whole lap).
ALTER TABLE audit_runs
    ADD COLUMN scrubbed_to uuid,
    ADD COLUMN cases_scrubbed integer NOT NULL DEFAULT 0 CHECK (cases_scrubbed >= 0),
    ADD COLUMN scrub_lapped boolean NOT NULL DEFAULT false;
