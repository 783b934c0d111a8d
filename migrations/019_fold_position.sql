-- casetrail schema, version 19: where a case row's status comes from. Several
-- consumers fold events into the same case, and a batch may hold events older than
-- one another consumer folded already (a REACT_CYCLE behind its attempt's
-- CASE_AWAITING_REVIEW): the status, answer and outcome follow a batch only when its
-- latest event is later than the one they were taken from (`folded_attempt`,
-- `folded_seq`), so an older event never sends a waiting case back to `running`.
ALTER TABLE cases ADD COLUMN folded_attempt int, ADD COLUMN folded_seq int;
