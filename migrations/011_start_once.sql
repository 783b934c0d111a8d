-- casetrail schema, version 11: a case's start command is published once.
--
-- A POST /cases repeated with the same Idempotency-Key returns the first case; it
-- publishes the start command again only while the first publish is unconfirmed
-- (`start_confirmed_at` still null: the first request may have died before the
-- broker's confirm) and only when it takes the short publishing lease
-- `start_publishing_until` atomically, so a burst of re-sends publishes at most one
-- copy. A new row holds the lease from its insert; the API notes the confirm.
ALTER TABLE cases
    ADD COLUMN start_confirmed_at     timestamptz,
    ADD COLUMN start_publishing_until timestamptz DEFAULT now() + interval '30 seconds';
-- Cases stored before this version had their start confirmed (or were withdrawn).
UPDATE cases SET start_confirmed_at = created_at, start_publishing_until = NULL;
