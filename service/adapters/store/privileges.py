"""What each component's database role may do, read back from the database that
``casetrail setup`` made (not from the statements it ran): the table docs/security.md
shows, which a test holds equal to a freshly set-up namespace's.

``python -m casetrail.adapters.store.privileges`` prints it for the configured namespace.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import asyncpg

from casetrail.config import DATABASE_COMPONENTS, Settings

# Every privilege a role holds in the public schema: on tables and views, on single
# columns, on functions (EXECUTE granted to PUBLIC is revoked by setup and migrations,
# so what shows here is granted by name).
_HELD = """
SELECT r.rolname AS role, a.privilege_type AS privilege, c.relname AS object, NULL AS columns
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
     aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE n.nspname = 'public' AND r.rolname = ANY($1::text[])
UNION ALL
SELECT r.rolname, a.privilege_type, c.relname, string_agg(att.attname, ', ' ORDER BY att.attnum)
FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid
     JOIN pg_namespace n ON n.oid = c.relnamespace,
     aclexplode(att.attacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE n.nspname = 'public' AND r.rolname = ANY($1::text[])
GROUP BY r.rolname, a.privilege_type, c.relname
UNION ALL
SELECT r.rolname, a.privilege_type, p.oid::regprocedure::text, NULL
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,
     aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE n.nspname = 'public' AND r.rolname = ANY($1::text[])
"""


async def privileges_table(settings: Settings) -> str:
    """The Markdown table of every component role's privileges (role names without the
    namespace), one row per role and privilege."""
    roles = {settings.database_role(c): c for c in DATABASE_COMPONENTS}
    conn = await asyncpg.connect(settings.database_url)
    try:
        rows = await conn.fetch(_HELD, list(roles))
    finally:
        await conn.close()
    held: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        what = row["object"] if row["columns"] is None else \
            f"{row['object']} ({row['columns']})"
        held[roles[row["role"]], row["privilege"]].append(what)
    lines = ["| role | privilege | on |", "|---|---|---|"]
    for component in DATABASE_COMPONENTS:
        for privilege in sorted(p for c, p in held if c == component):
            objects = ", ".join(f"`{o}`" for o in sorted(held[component, privilege]))
            lines.append(f"| `<ns>_{component}` | {privilege} | {objects} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(asyncio.run(privileges_table(Settings())), end="")
