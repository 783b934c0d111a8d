"""Spans as a waterfall, in HTML: how docs/trace-waterfall.png is drawn from the spans a
test received (what Jaeger or Tempo would show of the same trace)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from tests.support.otlp import ReceivedSpan

COLOURS = {"casetrail-api": "#2563eb", "casetrail-worker": "#7c3aed",
           "casetrail-capability": "#059669", "casetrail-consumer": "#d97706"}


def _ordered(spans: Sequence[ReceivedSpan]) -> list[tuple[int, ReceivedSpan]]:
    """Depth-first, children by start time: ``(depth, span)``."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    out: list[tuple[int, ReceivedSpan]] = []

    def walk(parent: str, depth: int) -> None:
        for child in sorted(children.get(parent, []), key=lambda s: s.start_ns):
            out.append((depth, child))
            walk(child.span_id, depth + 1)

    walk("", 0)
    return out


def render(spans: Sequence[ReceivedSpan], title: str) -> str:
    start = min(s.start_ns for s in spans)
    width = max(max(s.end_ns for s in spans) - start, 1)
    rows = []
    for depth, span in _ordered(spans):
        left = 100 * (span.start_ns - start) / width
        size = max(100 * (span.end_ns - span.start_ns) / width, 0.25)
        ms = (span.end_ns - span.start_ns) / 1e6
        detail = ", ".join(f"{k.removeprefix('gen_ai.')}={v}" for k, v in span.attributes.items()
                           if k in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                                    "gen_ai.tool.type", "casetrail.events"))
        rows.append(
            f'<div class="row"><div class="name" style="padding-left:{depth * 14}px">'
            f'<b style="color:{COLOURS.get(span.service, "#444")}">{html.escape(span.service)}'
            f'</b> {html.escape(span.name)}<small>{html.escape(detail)}</small></div>'
            f'<div class="lane"><div class="bar" style="left:{left:.2f}%;width:{size:.2f}%;'
            f'background:{COLOURS.get(span.service, "#444")}"></div>'
            f'<span class="ms" style="left:{min(left + size, 88):.2f}%">{ms:.1f} ms</span>'
            f'</div></div>')
    return f"""<!doctype html><meta charset="utf-8"><style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #111; }}
h1 {{ font-size: 16px; margin: 0 0 10px; }}
.row {{ display: flex; align-items: center; border-bottom: 1px solid #eee; height: 26px; }}
.name {{ width: 46%; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }}
.name small {{ color: #666; margin-left: 6px; }}
.lane {{ position: relative; width: 54%; height: 100%; background: #fafafa; }}
.bar {{ position: absolute; top: 7px; height: 12px; border-radius: 2px; opacity: .85; }}
.ms {{ position: absolute; top: 5px; margin-left: 4px; font-size: 11px; color: #333; }}
</style><h1>{html.escape(title)}</h1>{"".join(rows)}"""
