-- casetrail schema, version 22: a case's start, signed (docs/design.md, "A person's
-- action is signed"). The API signs each case it accepts with its action key (the case,
-- its tenant and agent, who started it, the digest of its recorded input); the worker
-- runs a case only when that signature holds for its row, so a row written with the
-- API's database password alone never runs.
ALTER TABLE cases ADD COLUMN start_action jsonb;

-- Cases accepted before starts were signed run as they did. Filled here, once; no
-- component writes it.
CREATE TABLE starts_before_signing (case_id uuid PRIMARY KEY);
INSERT INTO starts_before_signing (case_id) SELECT case_id FROM cases;
