-- casetrail schema, version 20: a person's action that no component can forge and no
-- race can bend (docs/design.md, "Review", "A person's action is signed").
--
-- The wait itself, beside `parked_attempt`: the worker notes what its attempt waits for
-- (a review, a second person's review of an override, or the answer to the model's
-- question `wait_call_id`) and the persons who may not act on it (the starter; for a
-- second review, everyone who reviewed the case before). The API keeps an action with
-- one statement that checks all of it against the same parked attempt.
ALTER TABLE cases
    ADD COLUMN wait_kind     text CHECK (wait_kind IN ('review', 'second_review', 'question')),
    ADD COLUMN wait_call_id  text,
    ADD COLUMN wait_excludes text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT cases_wait_call_id CHECK ((wait_kind = 'question') = (wait_call_id IS NOT NULL));

-- Cases waiting when this schema arrived: their wait, from the trail.
UPDATE cases c SET wait_kind = CASE
           WHEN w.payload ? 'question' THEN 'question'
           WHEN w.payload -> 'reviewReasons' ? 'second_review' THEN 'second_review'
           ELSE 'review' END,
       wait_call_id = w.payload -> 'question' ->> 'callId',
       wait_excludes = ARRAY(SELECT DISTINCT r.payload -> 'reviewer' ->> 'subject'
                             FROM event_log r WHERE r.case_id = c.case_id
                               AND r.event_type = 'CASE_REVIEWED'
                               AND w.payload -> 'reviewReasons' ? 'second_review')
FROM (SELECT DISTINCT ON (case_id) case_id, attempt, payload FROM event_log
      WHERE event_type = 'CASE_AWAITING_REVIEW' ORDER BY case_id, attempt DESC) w
WHERE w.case_id = c.case_id AND w.attempt = c.parked_attempt;

-- The public keys the API signs persons' actions with. Registered by an operator
-- (`casetrail setup`, `casetrail signer register --actions`); no component writes here,
-- so whoever holds a component's database password cannot vouch for a key of theirs.
CREATE TABLE action_keys (
    key_id          text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    public_key      bytea       NOT NULL UNIQUE CHECK (length(public_key) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    retired_at      timestamptz,
    not_valid_after timestamptz,
    CHECK ((retired_at IS NULL) = (not_valid_after IS NULL))
);

-- Each kept action carries what the API signed: the object (`signed`, canonical JSON
-- under a fixed context string), the action key's id and the Ed25519 signature.
ALTER TABLE case_actions
    ADD COLUMN signed jsonb,
    ADD COLUMN key_id text,
    ADD COLUMN sig    text;

-- Actions the worker refused to act on (a row no action key signed, or one that breaks
-- the wait's rules): moved here, out of the wait's way, kept for the investigation.
CREATE TABLE case_actions_refused (
    refusal_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    case_id        uuid        NOT NULL,
    parked_attempt int         NOT NULL,
    kind           text        NOT NULL,
    verdict        text,
    reason         text,
    decision       jsonb,
    reviewer       jsonb,
    acted_at       timestamptz NOT NULL,
    signed         jsonb,
    key_id         text,
    sig            text,
    refused_at     timestamptz NOT NULL DEFAULT now(),
    why            text        NOT NULL,
    why_code       text        NOT NULL
);
CREATE INDEX case_actions_refused_case ON case_actions_refused (case_id);
