"""``casetrail persons``: which identities are one person, for four eyes (an operator's
step, as the bootstrap user; docs/security.md)."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from casetrail.cli.common import run
from casetrail.config import get_settings
from casetrail.contract.auth import PERSON_PATTERN

persons_app = typer.Typer(no_args_is_help=True, help=(
    "One person across keys and tokens: link an OIDC subject (oidc:<sub>) or a key's "
    "person id (key:<person>) to a person, so the starter of a case never reviews it "
    "through another identity."))

IDENTITY = re.compile(r"^(oidc|key):[^\x00-\x1f\x7f]{1,200}$")


def _identity(identity: str) -> str:
    if not IDENTITY.match(identity):
        typer.echo(f"identity {identity!r} must be oidc:<sub> or key:<person id> (1 to 200 "
                   "characters, no control characters)", err=True)
        raise typer.Exit(2)
    return identity


@persons_app.command("link")
def link(
    identity: Annotated[str, typer.Argument(help="oidc:<sub>, or key:<person id>.")],
    person: Annotated[str, typer.Argument(help="The person it belongs to.")],
) -> None:
    """Link an identity to a person: four eyes then compares the person."""
    from casetrail.adapters.store import PersonIdentities, create_pool

    _identity(identity)
    if not PERSON_PATTERN.match(person):
        typer.echo(f"person {person!r} must match {PERSON_PATTERN.pattern}", err=True)
        raise typer.Exit(2)

    async def linked() -> None:
        pool = await create_pool(get_settings().database_url, max_size=1)
        try:
            await PersonIdentities(pool).link(identity, person)
        finally:
            await pool.close()

    run(linked())
    typer.echo(f"{identity} is {person}")


@persons_app.command("unlink")
def unlink(identity: Annotated[str, typer.Argument(help="oidc:<sub>, or key:<person id>.")]
           ) -> None:
    """Undo a link: the identity is its own person again."""
    from casetrail.adapters.store import PersonIdentities, create_pool

    _identity(identity)

    async def unlinked() -> bool:
        pool = await create_pool(get_settings().database_url, max_size=1)
        try:
            return await PersonIdentities(pool).unlink(identity)
        finally:
            await pool.close()

    if not run(unlinked()):
        typer.echo(f"{identity} was not linked", err=True)
        raise typer.Exit(1)
    typer.echo(f"{identity} unlinked")


@persons_app.command("list")
def list_links() -> None:
    """Every link, one a line: identity, person."""
    from casetrail.adapters.store import PersonIdentities, create_pool

    async def links() -> list[tuple[str, str]]:
        pool = await create_pool(get_settings().database_url, max_size=1)
        try:
            return await PersonIdentities(pool).all()
        finally:
            await pool.close()

    for identity, person in run(links()):
        typer.echo(f"{identity}\t{person}")
