"""The transparency log over HTTP, open to anyone (``/ledger/*`` is public: docs/design.md,
"Trust"): checkpoints, inclusion and consistency proofs (a leaf found by its index or its
hash), the log's key, and witnesses' cosignatures. Hashes and signed notes only: nothing here
reveals an event's contents, nor, to someone without its hashes, anything of a case."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from casetrail.adapters.store.ledger import (
    LedgerStore,
    StoredCheckpoint,
    UnknownCheckpoint,
    cosignature_for,
)
from casetrail.contract.auth import Principal
from casetrail.ledger.note import NoteError, TlogProof, Verifier
from casetrail.ledger.vouching import LogState

TEXT = "text/plain; charset=utf-8"

MAX_TREE = 2**63 - 1
"""A tree size or leaf index the log can hold (Postgres bigint): a larger one in a query
is a 422, not a database error."""

TreeSize = Annotated[int | None, Query(alias="treeSize", ge=1, le=MAX_TREE,
                                       description="A checkpoint's size; default the latest.")]

NOTE_PATTERN = (r"^[^\n]+\n(0|[1-9][0-9]*)\n[A-Za-z0-9+/]{43}=\n\n"
                "(\u2014 [^ \\n]+ [A-Za-z0-9+/]+=*\\n)+$")
"""A checkpoint's note with its signature lines (what a witness hands in)."""


class CheckpointView(BaseModel):
    treeSize: int
    rootHash: str = Field(description="Base64 of the 32-byte root hash.")
    note: str = Field(description="The signed note (c2sp.org/tlog-checkpoint in "
                      "c2sp.org/signed-note), with the witnesses' cosignatures.")
    createdAt: str


class Checkpoints(BaseModel):
    checkpoints: list[CheckpointView]


class InclusionProof(BaseModel):
    leafIndex: int
    treeSize: int
    eventHash: str | None = Field(description="The leaf's data: the event's chain hash "
                                  "(64 hex), when asked by hash or event id.")
    proof: list[str] = Field(description="RFC 9162 inclusion path, base64, the leaf's "
                             "sibling first.")
    checkpoint: str
    tlogProof: str = Field(description="The same as c2sp.org/tlog-proof@v1 text.")


class ConsistencyProof(BaseModel):
    treeSizeFrom: int = Field(alias="from")
    treeSizeTo: int = Field(alias="to")
    proof: list[str] = Field(description="RFC 9162 consistency proof, base64.")


class Cosigned(BaseModel):
    treeSize: int
    accepted: list[str] = Field(description="Witnesses whose cosignature was kept.")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _view(checkpoint: StoredCheckpoint) -> dict[str, Any]:
    return {"treeSize": checkpoint.size, "rootHash": _b64(checkpoint.root),
            "note": checkpoint.served,
            "createdAt": checkpoint.created_at.isoformat().replace("+00:00", "Z")}


def _not_found(detail: str) -> HTTPException:
    return HTTPException(404, detail)


def _unprocessable(field: str, message: str, where: str = "query") -> HTTPException:
    return HTTPException(422, [{"loc": [where, field], "msg": message, "type": "value_error"}])


Vouching = Callable[[StoredCheckpoint | None], Awaitable[LogState]]
"""The log's state given the database's latest checkpoint (casetrail.api.log_watch)."""


@dataclass
class _Log:
    """What the log's routes share: the store (once the app has opened), the log's state
    and the answer."""

    ledger: Callable[[], LedgerStore]
    vouching: Callable[[], Vouching]
    json_response: Callable[..., Response]

    async def vouched(self) -> StoredCheckpoint | None:
        """The database's latest checkpoint, once the log is known to vouch for it: 503
        naming the halt and both sizes while it does not (docs/design.md, "The log says
        when it has stopped vouching")."""
        checkpoint = await self.ledger().latest()
        state = await self.vouching()(checkpoint)
        if state.halted:
            raise HTTPException(503, state.detail)
        return checkpoint

    async def latest(self) -> StoredCheckpoint:
        checkpoint = await self.vouched()
        if checkpoint is None:
            raise _not_found("the log has signed no checkpoint yet")
        return checkpoint

    async def at_size(self, size: int | None) -> StoredCheckpoint:
        if size is None:
            return await self.latest()
        await self.vouched()
        try:
            return await self.ledger().checkpoint(size)
        except UnknownCheckpoint as exc:
            raise _not_found(str(exc)) from None

    async def inclusion_proof(self, leaf_index: int, tree_size: int | None,
                              event_hash: str | None, what: str) -> Response:
        head = await self.at_size(tree_size)
        if leaf_index >= head.size:
            raise _not_found(f"{what} is not in the tree of checkpoint {head.size}")
        path = await self.ledger().inclusion(leaf_index, head.size)
        return self.json_response({
            "leafIndex": leaf_index, "treeSize": head.size, "eventHash": event_hash,
            "proof": [_b64(h) for h in path], "checkpoint": head.served,
            "tlogProof": TlogProof(leaf_index, tuple(path), head.served).render()})


Responses = Callable[..., dict[int | str, dict[str, Any]]]


def ledger_routes(app: FastAPI | APIRouter, ledger: Callable[[], LedgerStore],
                  vouching: Callable[[], Vouching], witnesses: list[Verifier],
                  public: Any, reader: Any,
                  owned_case: Callable[[uuid.UUID, Principal], Awaitable[Any]],
                  responses: Responses,
                  json_response: Callable[..., Response]) -> None:
    """Add ``/ledger/*`` to ``app`` (``ledger``: the store, once the app has opened;
    ``vouching``: the log's state, once it has), and a case's own lookup of an event's
    proof (``reader``, ``owned_case``: the case's access rules)."""
    log = _Log(ledger, vouching, json_response)
    _checkpoint_routes(app, log, public, responses)
    _proof_routes(app, log, public, reader, owned_case, responses)
    _cosignature_routes(app, log, witnesses, public, responses)


def _checkpoint_routes(app: FastAPI | APIRouter, log: _Log, public: Any,
                       responses: Responses) -> None:
    """The log's checkpoints and its keys."""

    @app.get("/ledger/checkpoint", summary="The log's latest signed checkpoint",
             response_class=Response,
             responses={**responses(200, Checkpoints, "", 404, 503),
                        200: {"content": {"text/plain": {}}, "description":
                              "c2sp.org/tlog-checkpoint in a c2sp.org/signed-note, with "
                              "the witnesses' cosignatures"}})
    async def checkpoint(_: Principal = public) -> Response:
        return Response((await log.latest()).served, media_type=TEXT)

    @app.get("/ledger/checkpoints", summary="Signed checkpoints, oldest first",
             response_model=Checkpoints, responses=responses(200, Checkpoints,
                                                      "Checkpoints larger than since", 422, 503))
    async def checkpoints(
        since: Annotated[int, Query(ge=0, le=MAX_TREE, description="Only checkpoints of a larger "
                                    "tree.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        _: Principal = public,
    ) -> Response:
        await log.vouched()
        found = await log.ledger().checkpoints(since, limit)
        return log.json_response({"checkpoints": [_view(c) for c in found]})

    @app.get("/ledger/key", summary="The log's verifier keys (c2sp.org/signed-note)",
             response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "One <origin>+<hash>+<key> per line"}})
    async def key(_: Principal = public) -> Response:
        return Response("".join(f"{k}\n" for k in await log.ledger().verifier_keys()),
                        media_type=TEXT)


def _proof_routes(app: FastAPI | APIRouter, log: _Log, public: Any, reader: Any,
                  owned_case: Callable[[uuid.UUID, Principal], Awaitable[Any]],
                  responses: Responses) -> None:
    """Inclusion proofs (by leaf, by event hash, by a case's event) and consistency
    proofs."""

    @app.get("/ledger/proofs/inclusion", summary="A leaf's inclusion proof",
             response_model=InclusionProof,
             responses=responses(200, InclusionProof, "The RFC 9162 inclusion path",
                                 404, 422, 503))
    async def inclusion(
        leaf_index: Annotated[int, Query(alias="leafIndex", ge=0, le=MAX_TREE)],
        tree_size: TreeSize = None,
        _: Principal = public,
    ) -> Response:
        return await log.inclusion_proof(leaf_index, tree_size, None, f"leaf {leaf_index}")

    @app.get("/ledger/leaves/{event_hash}/proof", summary="The inclusion proof of the "
             "leaf whose data is this event hash", response_model=InclusionProof,
             responses=responses(200, InclusionProof, "The RFC 9162 inclusion path of the "
                                 "hash's leaf", 404, 422, 503))
    async def hash_inclusion(
        event_hash: Annotated[str, Path(pattern="^[0-9a-f]{64}$", description=
                                        "An event's chain hash, 64 lowercase hex.")],
        tree_size: TreeSize = None,
        _: Principal = public,
    ) -> Response:
        """For whoever holds an event's hash (a bundle, a trail): nothing is learnt by
        anyone without it. By event id, see `GET /cases/{caseId}/events/{eventId}/proof`."""
        leaf_index = await log.ledger().leaf_of_hash(event_hash)
        if leaf_index is None:
            raise _not_found(f"no leaf holds {event_hash} (yet)")
        return await log.inclusion_proof(leaf_index, tree_size, event_hash, f"hash {event_hash}")

    @app.get("/cases/{case_id}/events/{event_id}/proof", summary="The inclusion proof of "
             "one of the case's events", response_model=InclusionProof,
             responses=responses(200, InclusionProof, "The RFC 9162 inclusion path of the "
                                 "event's leaf", 401, 403, 404, 422, 503))
    async def event_inclusion(
        case_id: uuid.UUID,
        event_id: uuid.UUID,
        tree_size: TreeSize = None,
        principal: Principal = reader,
    ) -> Response:
        """Behind the case's own access rules: event ids derive from the case id, so a
        public lookup by id would let anyone holding a case id count its events."""
        await owned_case(case_id, principal)
        found = await log.ledger().event_leaf(case_id, event_id)
        if found is None:
            raise _not_found(f"event {event_id} of case {case_id} is not in the log (yet)")
        leaf_index, event_hash = found
        return await log.inclusion_proof(leaf_index, tree_size, event_hash, f"event {event_id}")

    @app.get("/ledger/proofs/consistency", summary="A consistency proof between two sizes",
             response_model=ConsistencyProof,
             responses=responses(200, ConsistencyProof, "The RFC 9162 consistency proof",
                                 404, 422, 503))
    async def consistency(
        old: Annotated[int, Query(alias="from", ge=0, le=MAX_TREE)],
        new: Annotated[int | None, Query(alias="to", ge=0, le=MAX_TREE, description=
                                         "Default: the latest checkpoint's size.")] = None,
        _: Principal = public,
    ) -> Response:
        limit = (await log.latest()).size
        new = limit if new is None else new
        if new > limit:
            raise _not_found(f"the latest checkpoint has {limit} leaves, not {new}")
        if old > new:
            raise _not_found(f"no consistency proof leads from a tree of {old} leaves to a "
                             f"smaller one of {new}")
        path = await log.ledger().consistency(old, new)
        return log.json_response({"from": old, "to": new, "proof": [_b64(h) for h in path]})


def _cosignature_routes(app: FastAPI | APIRouter, log: _Log, witnesses: list[Verifier],
                        public: Any, responses: Responses) -> None:
    """Witnesses hand in their cosignatures."""

    @app.post("/ledger/cosignatures", status_code=201, summary="Hand in a witness's "
              "cosignature of a checkpoint", response_model=Cosigned,
              openapi_extra={"requestBody": {"required": True, "content": {"text/plain": {
                  "schema": {"type": "string", "pattern": NOTE_PATTERN}}}}},
              responses=responses(201, Cosigned, "Cosignatures checked and kept",
                                  404, 422, 503))
    async def cosignatures(request: Request, _: Principal = public) -> Response:
        text = (await request.body()).decode("utf-8", errors="replace")
        try:
            size = int(text.split("\n", 2)[1])
            if size > MAX_TREE:
                raise ValueError(f"tree size {size} is beyond any this log can hold")
            await log.vouched()
            head = await log.ledger().checkpoint(size)
            found = cosignature_for(text, head, witnesses)
        except (IndexError, ValueError, NoteError) as exc:
            raise _unprocessable("note", f"not a cosigned checkpoint of this log: {exc}",
                                 "body") from None
        except UnknownCheckpoint as exc:
            raise _not_found(str(exc)) from None
        if not found:
            raise _unprocessable("note", "no valid cosignature of a witness this log knows "
                                 "(CASETRAIL_LEDGER_WITNESSES)", "body")
        for witness, signature in found:
            await log.ledger().keep_cosignature(size, witness.name, signature)
        return log.json_response({"treeSize": size, "accepted": [w.name for w, _ in found]},
                             status_code=201)
