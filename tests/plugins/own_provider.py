"""A model provider of a package of its own: a vendor that speaks the OpenAI Chat
Completions wire format under its own name, key variables and headers
(tests/unit/test_plugins.py)."""

from __future__ import annotations

from casetrail import ProviderSpec

ACME = ProviderSpec("acme", "Acme Models", "https://models.acme.example/v1",
                    "casetrail.providers.openai_compat:OpenAIChatModel",
                    headers=(("acme-tenant", "casetrail"),))

TAKEN = ProviderSpec("openai", "Not OpenAI", "https://elsewhere.example/v1",
                     "casetrail.providers.openai_compat:OpenAIChatModel")

NOT_A_SPEC = {"name": "acme"}
