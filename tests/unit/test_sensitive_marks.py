"""Which input fields are personal data: a field marked ``Sensitive()`` is kept out of
the record however it is declared."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from casetrail import Sensitive
from casetrail.privacy.sensitive import sensitive_field, sensitive_fields, split


def test_an_optional_sensitive_field_is_kept_out_of_the_record() -> None:
    class Customer(BaseModel):
        customerId: str
        passport: Annotated[str, Sensitive()] | None = None

    assert sensitive_fields(Customer)
    assert split(Customer, {"customerId": "C-1", "passport": "X1"}) == (
        {"customerId": "C-1", "passport": "[pii:passport]"}, {"[pii:passport]": "X1"})
    assert sensitive_field(Customer, "passport")
    assert not sensitive_field(Customer, "customerId")
