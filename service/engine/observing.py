"""What the engine tells whoever watches it (metrics, traces), through an observer it
is given rather than an import: the engine knows no telemetry, and a run without an
observer (a plugin's test, a replay) counts nothing. The worker gives it casetrail's
(``service/telemetry/observer.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from casetrail.contract.events import TokenUsage
from casetrail.engine.chat import AssistantTurn, ChatMessage


class ModelCallWatch(Protocol):
    """One request to the model."""

    def answered(self, turn: AssistantTurn, seconds: float) -> None: ...

    def failed(self, kind: str, reason: str, seconds: float, *, counted: str | None
               ) -> None:
        """``counted``: ``retryable`` (it will be asked again), ``refused``, or ``None``
        when the request was abandoned (deadline, cancel, shutdown)."""


class AttemptWatch(Protocol):
    """One attempt of a case."""

    def started(self) -> None: ...

    def trace_ids(self) -> tuple[str, str] | None:
        """The attempt's trace and span ids, for ``CASE_STARTED`` (none: not traced)."""

    def model_call(self, model: str, prompt: Sequence[ChatMessage]) -> ModelCallWatch: ...

    def retried(self) -> None: ...

    def cycle(self, usage: TokenUsage) -> None: ...

    def ended(self, outcome: str, reason: str | None, usage: TokenUsage) -> None: ...

    def finish(self) -> None:
        """The attempt is over (also when abandoned without an end)."""


class ToolWatch(Protocol):
    """One tool call."""

    def current(self) -> AbstractContextManager[Any]:
        """The call's own span current while it runs (what it calls is its child)."""

    def done(self, error: str | None, result: Any, seconds: float) -> None: ...


class Observer(Protocol):
    def attempt(self, *, agent: str, agent_version: str, case_id: str, attempt: int,
                provider: str, model: str, redact: Callable[[str], str]) -> AttemptWatch: ...

    def tool(self, label: str, call_id: str, source: str, arguments: Any) -> ToolWatch: ...


class _Quiet:
    """Watches and tells nobody."""

    def started(self) -> None:
        pass

    def trace_ids(self) -> tuple[str, str] | None:
        return None

    def model_call(self, model: str, prompt: Sequence[ChatMessage]) -> _Quiet:
        return self

    def answered(self, turn: AssistantTurn, seconds: float) -> None:
        pass

    def failed(self, kind: str, reason: str, seconds: float, *, counted: str | None
               ) -> None:
        pass

    def retried(self) -> None:
        pass

    def cycle(self, usage: TokenUsage) -> None:
        pass

    def ended(self, outcome: str, reason: str | None, usage: TokenUsage) -> None:
        pass

    def finish(self) -> None:
        pass

    @contextmanager
    def current(self) -> Iterator[None]:
        yield

    def done(self, error: str | None, result: Any, seconds: float) -> None:
        pass


QUIET = _Quiet()


class QuietObserver:
    """The observer of a run nobody watches."""

    def attempt(self, **_: Any) -> AttemptWatch:
        return QUIET

    def tool(self, label: str, call_id: str, source: str, arguments: Any) -> ToolWatch:
        return QUIET


NO_OBSERVER = QuietObserver()
