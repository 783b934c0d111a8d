-- casetrail schema, version 18: a review's deadline. When a case starts waiting for a
-- person, the worker notes when that wait becomes overdue (the tenant's deadline, else
-- the agent's, else the deployment's). An overdue review is counted, alerted on and
-- marked in the review queue; it never decides the case (docs/design.md, "Review").
ALTER TABLE cases ADD COLUMN review_due_at timestamptz;
