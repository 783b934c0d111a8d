"""Scopes by name: what a stored key or a token holds (strings) against what a route or an
operation needs (a ``Scope``)."""

from __future__ import annotations

import pytest

from casetrail.contract.auth import (
    SCOPES,
    AuthError,
    Principal,
    Scope,
    check_key_scopes,
    operator,
    parse_scopes,
)


def test_a_scope_held_as_text_is_the_scope_a_route_needs() -> None:
    held = Principal("acme", frozenset(parse_scopes("cases:read,pii:read")), "key:abc")
    assert held.allows(Scope.READ) and held.allows(Scope.PII_READ)
    assert not held.allows(Scope.START) and not held.allows(Scope.CANCEL)


def test_admin_holds_every_scope_but_review_which_is_a_persons() -> None:
    assert all(operator().allows(s) for s in Scope if s is not Scope.REVIEW)
    assert not operator().allows(Scope.REVIEW)
    person = Principal("acme", frozenset({"cases:review"}), "key:abc", person="sam")
    assert person.allows(Scope.REVIEW)
    assert not Principal("acme", frozenset({"cases:review"}), "key:abc").allows(Scope.REVIEW)


def test_the_names_keys_carry_are_the_members_values() -> None:
    assert SCOPES == ("cases:start", "cases:read", "cases:cancel", "cases:review",
                      "models:override", "pii:read", "retention:manage", "holds:manage",
                      "backtests:run", "admin")
    with pytest.raises(AuthError, match="unknown scopes"):
        parse_scopes("cases:raed")
    with pytest.raises(AuthError, match="cannot also start cases"):
        check_key_scopes(parse_scopes("cases:review,cases:start"), "sam")

