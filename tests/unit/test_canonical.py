"""Canonical JSON (RFC 8785) written by ``orjson`` where it provably can: every value
gives the same bytes as the ``rfc8785`` package, over generated JSON values (floats of
every magnitude, integers beyond a double, keys and strings from all of Unicode) and the
RFC's own examples."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

import orjson
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from casetrail.contract.integrity import Signer, _representable, canonical, signature_valid
from tests.support.properties import examples


def reference(value: Any) -> bytes:
    """What canonical() wrote before its fast path: the rfc8785 package alone."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return rfc8785.dumps(_representable(value))


SCALARS = (
    st.none() | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=1e-7, max_value=1e22) | st.floats(min_value=-1e22, max_value=-1e-7)
    | st.integers(-(2**53), 2**53).map(float)
    | st.text()
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=6)
    | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=examples(3000), deadline=None)
@given(JSON)
def test_every_json_value_gives_the_bytes_of_rfc8785(value: Any) -> None:
    assert canonical(value) == reference(value)


@settings(max_examples=examples(3000), deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_is_written_as_ecmascript_writes_it(value: float) -> None:
    assert canonical(value) == rfc8785.dumps(value)
    assert canonical({"x": [value]}) == rfc8785.dumps({"x": [value]})


@settings(max_examples=examples(2000), deadline=None)
@given(st.dictionaries(st.text(alphabet=st.characters(codec="utf-8"), max_size=4),
                       st.integers(0, 9), max_size=8))
def test_keys_sort_as_utf16_code_units(value: dict[str, int]) -> None:
    assert canonical(value) == rfc8785.dumps(value)


# RFC 8785, Appendix B: IEEE 754 doubles and the text JCS gives them.
RFC_NUMBERS = {
    "0000000000000000": "0", "8000000000000000": "0", "0000000000000001": "5e-324",
    "8000000000000001": "-5e-324", "7fefffffffffffff": "1.7976931348623157e+308",
    "ffefffffffffffff": "-1.7976931348623157e+308", "4340000000000000": "9007199254740992",
    "c340000000000000": "-9007199254740992", "4430000000000000": "295147905179352830000",
    "44b52d02c7e14af5": "9.999999999999997e+22", "44b52d02c7e14af6": "1e+23",
    "44b52d02c7e14af7": "1.0000000000000001e+23", "444b1ae4d6e2ef4e": "999999999999999700000",
    "444b1ae4d6e2ef4f": "999999999999999900000", "444b1ae4d6e2ef50": "1e+21",
    "3eb0c6f7a0b5ed8c": "9.999999999999997e-7", "3eb0c6f7a0b5ed8d": "0.000001",
    "41b3de4355555553": "333333333.3333332", "41b3de4355555554": "333333333.33333325",
    "41b3de4355555555": "333333333.3333333", "41b3de4355555556": "333333333.3333334",
    "41b3de4355555557": "333333333.33333343", "becbf647612f3696": "-0.0000033333333333333333",
    "43143ff3c1cb0959": "1424953923781206.2",
}


def test_the_rfcs_numbers() -> None:
    for bits, text in RFC_NUMBERS.items():
        value = struct.unpack(">d", bytes.fromhex(bits))[0]
        assert canonical(value) == text.encode(), bits
        assert canonical({"n": value}) == b'{"n":' + text.encode() + b"}", bits


def test_the_rfcs_key_order_example() -> None:
    """RFC 8785, section 3.2.3: keys in UTF-16 code-unit order (the emoji's surrogates
    before U+FB33, though its code point is greater)."""
    value = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet "
             "With Dagesh", "1": "One", "\U0001f600": "Emoji: Grinning Face",
             "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}
    assert list(orjson.loads(canonical(value))) == [
        "\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert canonical(value) == rfc8785.dumps(value)


def test_the_rfcs_string_escapes() -> None:
    """Section 3.2.2.2: the short escapes, \\u00XX in lowercase for the other controls,
    everything else (DEL, U+2028, non-ASCII, "/") as itself."""
    text = "".join(chr(c) for c in range(0x20)) + "\"\\/\x7f\u2028é\U0001f600"
    assert canonical(text) == rfc8785.dumps(text)
    assert canonical(text).startswith(b'"\\u0000\\u0001')
    assert b"\\b\\t\\n\\u000b\\f\\r" in canonical(text)


def test_a_big_integer_is_written_as_before() -> None:
    assert canonical(2**60) == reference(2**60) == b"1152921504606847000"
    assert canonical(2**60 + 1) == b'"1152921504606846977"'


def test_libsodium_signs_the_bytes_openssl_would_and_refuses_what_it_should() -> None:
    """Signing and verifying go through libsodium (PyNaCl); Ed25519 is deterministic, so
    the signatures are the bytes ``cryptography`` (OpenSSL) makes, and they verify there;
    an altered hash, another key or a malformed signature does not verify."""
    signer = Signer.generate()
    digest = hashlib.sha256(b"an event").hexdigest()
    sig = signer.sign(digest)
    private = serialization.load_pem_private_key(signer.to_pem(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    assert base64.urlsafe_b64decode(sig + "==") == private.sign(bytes.fromhex(digest))
    Ed25519PublicKey.from_public_bytes(signer.public_key).verify(
        base64.urlsafe_b64decode(sig + "=="), bytes.fromhex(digest))
    assert signature_valid(signer.public_key, digest, sig)
    other = hashlib.sha256(b"another event").hexdigest()
    assert not signature_valid(signer.public_key, other, sig)
    assert not signature_valid(Signer.generate().public_key, digest, sig)
    raw = bytearray(base64.urlsafe_b64decode(sig + "=="))
    raw[0] ^= 0x01  # one bit of R changed (editing the text's last characters may not)
    altered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    assert not signature_valid(signer.public_key, digest, altered)
    assert not signature_valid(signer.public_key, digest, "not base64!")
    assert not signature_valid(b"\x00" * 32, digest, sig)  # a small-order key
