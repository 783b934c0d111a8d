"""The case operations, one set under every front: the API's routes and the CLI's
commands call these and hold no logic of their own (docs/design.md, "The parts").
Each is a plain async function over the services (the store, the bus, the vault),
returning plain results and raising the refusals of ``casetrail.cases.errors``."""

from casetrail.cases.reading import events, export, get, search, status, verify
from casetrail.cases.services import CaseServices, case_services
from casetrail.cases.start import Started, offered, start
from casetrail.cases.stopping import cancel, erase

__all__ = ["CaseServices", "Started", "cancel", "case_services", "erase", "events", "export",
           "get", "offered", "search", "start", "status", "verify"]
