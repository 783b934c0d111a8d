"""OIDC bearer tokens against a local JWKS server, with tokens signed here: the valid
one is accepted as its tenant with its scopes; expired, wrong audience, wrong issuer,
unknown key id, ``alg: none`` and HS256 "signed" with the public key are refused."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.helpers import ended
from tests.support.stack import InProcessStack, module_stack, serve_api

ISSUER, AUDIENCE = "https://login.example.test/", "casetrail-api"


@pytest.fixture(scope="module")
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwks_url(signing_key: rsa.RSAPrivateKey) -> Iterator[str]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "key-1", "use": "sig", "alg": "RS256"}]})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()


stack = module_stack(worker_concurrency=2)


def token(key: Any, *, kid: str = "key-1", algorithm: str = "RS256", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "auditor-7", "iat": now, "exp": now + 300,
            "tenant": "stark", "scope": "cases:start cases:read", **claims}
    return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid})


async def test_oidc_tokens_are_checked_against_the_issuers_keys(
    settings: Settings, stack: InProcessStack, jwks_url: str, signing_key: rsa.RSAPrivateKey,
) -> None:
    configured = settings.model_copy(update={
        "oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_jwks_url": jwks_url})
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = signing_key.public_key().public_bytes(Encoding.PEM,
                                                       PublicFormat.SubjectPublicKeyInfo)
    refused = {
        "expired": token(signing_key, exp=int(time.time()) - 10),
        "wrong audience": token(signing_key, aud="someone-else"),
        "wrong issuer": token(signing_key, iss="https://evil.example.test/"),
        "unknown kid": token(other_key, kid="key-9"),
        "signed by another key": token(other_key),
        "alg none": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "tenant": "stark",
                                "exp": int(time.time()) + 300}, "", algorithm="none",
                               headers={"kid": "key-1"}),
        "HS256 with the public key": _hs256_with(public_pem),
        "no tenant": token(signing_key, tenant=None),
    }
    async with serve_api(configured) as base_url, httpx.AsyncClient(base_url=base_url) as http:
        good = {"Authorization": f"Bearer {token(signing_key)}"}
        me = await http.get("/me", headers=good)
        assert me.json() == {"tenant": "stark", "subject": "oidc:auditor-7",
                             "scopes": ["cases:read", "cases:start"], "person": "auditor-7"}
        started = await http.post("/cases", headers=good, json={
            "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0]})
        assert started.status_code == 202, started.text
        case_id = started.json()["caseId"]
        cancel = await http.post(f"/cases/{case_id}/cancel", headers=good)
        assert cancel.status_code == 403 and "cases:cancel" in cancel.text
        for why, bad in refused.items():
            reply = await http.get(f"/cases/{case_id}",
                                   headers={"Authorization": f"Bearer {bad}"})
            assert reply.status_code == 401, why
        http.headers.update(good)
        case = await ended(http, case_id)
        trail = (await http.get(f"/cases/{case_id}/events")).json()["events"]
    assert case["answer"]["decision"] == "approve"
    assert trail[0]["tenantId"] == "stark"
    assert trail[0]["payload"]["startedBy"] == "oidc:auditor-7"


def _hs256_with(secret: bytes) -> str:
    """An HS256 token whose HMAC key is the issuer's public key: the classic confusion
    (PyJWT refuses to make one, so it is assembled by hand)."""
    import base64
    import hashlib
    import hmac

    def part(value: dict[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    now = int(time.time())
    head = part({"alg": "HS256", "typ": "JWT", "kid": "key-1"})
    claims = part({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "tenant": "stark",
                   "scope": "admin", "exp": now + 300})
    mac = hmac.new(secret, head + b"." + claims, hashlib.sha256).digest()
    return (head + b"." + claims + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()


async def test_without_oidc_configured_a_jwt_is_just_an_unknown_key(
    stack: InProcessStack, signing_key: rsa.RSAPrivateKey,
) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        reply = await http.get("/agents",
                               headers={"Authorization": f"Bearer {token(signing_key)}"})
    assert reply.status_code == 401


async def test_a_token_is_held_to_the_key_rules_and_its_subject_to_plain_text(
    settings: Settings, stack: InProcessStack, jwks_url: str, signing_key: rsa.RSAPrivateKey,
) -> None:
    """``cases:review`` never beside ``cases:start`` (or admin) in one token; a subject
    with a NUL or another control character, or over 200 characters, is a 401 naming
    the reason, never a 500 and never stored; a subject as an IdP writes it
    (``auth0|…``) is accepted as given."""
    configured = settings.model_copy(update={
        "oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_jwks_url": jwks_url})
    refused = {
        "review beside start": (token(signing_key, scope="cases:start cases:read cases:review",
                                      sub="u-sam-123"), "four eyes"),
        "review beside admin": (token(signing_key, scope="admin cases:review"), "four eyes"),
        "NUL in sub": (token(signing_key, sub="sam\u0000"), "control character"),
        "newline in sub": (token(signing_key, sub="sam\nadmin"), "control character"),
        "long sub": (token(signing_key, sub="s" * 201), "1 to 200"),
    }
    async with serve_api(configured) as base_url, httpx.AsyncClient(base_url=base_url) as http:
        for why, (bad, reason) in refused.items():
            reply = await http.post("/cases", headers={"Authorization": f"Bearer {bad}"},
                                    json={"agent": "loan-officer",
                                          "input": SAMPLE_APPLICATIONS[0]})
            assert reply.status_code == 401, (why, reply.text)
            assert reason in reply.json()["detail"], (why, reply.text)
        idp = {"Authorization": f"Bearer {token(signing_key, sub='auth0|64f1c2ab9e')}"}
        me = await http.get("/me", headers=idp)
        assert me.status_code == 200 and me.json()["person"] == "auth0|64f1c2ab9e", me.text


async def test_four_eyes_compares_persons_across_linked_tokens_and_keys(
    settings: Settings, stack: InProcessStack, jwks_url: str, signing_key: rsa.RSAPrivateKey,
    pool: asyncpg.Pool,
) -> None:
    """Sam starts a case with his identity provider's token (sub u-sam-123) and holds a
    reviewer's key made for person "sam". Once an operator links the two
    (`casetrail persons link oidc:u-sam-123 sam`), neither that key nor another token
    linked to sam reviews his case (403, four eyes); Rita's does."""
    configured = settings.model_copy(update={
        "oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_jwks_url": jwks_url})
    linked = await asyncio.to_thread(_cli, settings, "persons", "link", "oidc:u-sam-123", "sam")
    assert linked.returncode == 0, linked.stderr
    also = await asyncio.to_thread(_cli, settings, "persons", "link", "oidc:u-sam-456", "sam")
    assert also.returncode == 0, also.stderr
    listed = await asyncio.to_thread(_cli, settings, "persons", "list")
    assert "oidc:u-sam-123\tsam" in listed.stdout
    refused = await asyncio.to_thread(_cli, settings, "persons", "link", "sam", "sam")
    assert refused.returncode == 2 and "oidc:<sub> or key:<person id>" in refused.stderr
    keys = ApiKeyStore(pool)
    sams_key = (await keys.create("stark", ("cases:review", "cases:read"), None, None, "sam"))[1]
    ritas_key = (await keys.create("stark", ("cases:review", "cases:read"), None, None,
                                   "rita"))[1]
    starter = token(signing_key, sub="u-sam-123")
    other_sam = token(signing_key, sub="u-sam-456", scope="cases:review cases:read")
    async with serve_api(configured) as base_url, httpx.AsyncClient(base_url=base_url) as http:
        started = await http.post("/cases", headers={"Authorization": f"Bearer {starter}"},
                                  json={"agent": "loan-officer",
                                        "input": SAMPLE_APPLICATIONS[1]})  # referred
        assert started.status_code == 202, started.text
        case_id = started.json()["caseId"]
        http.headers["Authorization"] = f"Bearer {starter}"
        assert (await ended(http, case_id))["status"] == "awaiting_review"
        confirm = {"verdict": "confirm", "reason": "Referred rightly."}
        for credential in (sams_key, other_sam):
            own = await http.post(f"/cases/{case_id}/review", json=confirm,
                                  headers={"Authorization": f"Bearer {credential}"})
            assert own.status_code == 403 and "four eyes" in own.text, own.text
        rita = await http.post(f"/cases/{case_id}/review", json=confirm,
                               headers={"Authorization": f"Bearer {ritas_key}"})
        assert rita.status_code == 202, rita.text
        case = await ended(http, case_id, statuses=("awaiting_review",))
    assert case["status"] == "completed", case


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args], capture_output=True,
                          text=True, env=settings.environment(), timeout=60, check=False)
