"""The HTML pages a person reads after a run (``make demo``'s report, ``disagg replay``'s): one style, tables as
tables, and the few drawings that need no plotting library (a trace waterfall as SVG).

Pure functions from data to markup; every text is escaped here, so callers pass plain strings. A page must read
on a laptop screen without scrolling sideways: wide tables scroll inside their own box, images and drawings
scale to the page's width, long identifiers wrap (tests/demo/test_report_browser.py checks it in a real browser).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;padding:1.5em 2em;max-width:1200px;
color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em;margin:.2em 0 .4em}h2{font-size:1.25em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd}
h3{font-size:1.05em;margin:1.2em 0 .4em}
p.lead{color:#444;margin-top:0}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:.92em}
td,th{border:1px solid #d5d5d5;padding:3px 8px;vertical-align:top}
th{background:#f3f3f3;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.id{font-family:ui-monospace,monospace;font-size:.9em;overflow-wrap:anywhere}
p.cap{margin:.6em 0 .2em;color:#444}
img,svg.fig{max-width:100%;height:auto;display:block}
figure{margin:.5em 0 1.2em}figcaption{color:#555;font-size:.9em}
.bad{color:#b00020;font-weight:600}.ok{color:#17663a}
details{margin:.4em 0}summary{cursor:pointer;font-weight:600}
nav ul{padding-left:1.2em;columns:2}
code{font-family:ui-monospace,monospace;font-size:.92em;overflow-wrap:anywhere}
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Cell:
    """A table cell: ``text`` escaped; ``kind`` picks its style: ``n`` (a number, right-aligned), ``id`` (an
    identifier that may wrap anywhere), ``""`` (prose); ``href`` makes it a link; ``status`` ok|bad colours it."""

    text: str
    kind: str = ""
    href: str | None = None
    status: str = ""


def cell(value: object, kind: str = "", href: str | None = None, status: str = "") -> Cell:
    return Cell("-" if value is None else str(value), kind, href, status)


def _td(c: Cell | str) -> str:
    c = c if isinstance(c, Cell) else Cell(c)
    classes = " ".join(x for x in (c.kind, c.status) if x)
    body = esc(c.text) if c.href is None else f'<a href="{esc(c.href)}">{esc(c.text)}</a>'
    return f'<td class="{classes}">{body}</td>' if classes else f"<td>{body}</td>"


def table(head: Sequence[str], rows: Sequence[Sequence[Cell | str]], caption: str | None = None) -> str:
    """A table in a box that scrolls sideways on its own when it is wider than the page."""
    cap = f'<p class="cap">{esc(caption)}</p>' if caption else ""  # a <caption> would wrap to the table's width
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    return f'{cap}<div class="scroll"><table><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table></div>'


def section(title: str, body: str, anchor: str | None = None) -> str:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{body}</section>"


def paragraph(text: str, lead: bool = False) -> str:
    return f'<p class="lead">{esc(text)}</p>' if lead else f"<p>{esc(text)}</p>"


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def figure(src: str, alt: str, caption: str) -> str:
    return (f'<figure><img src="{esc(src)}" alt="{esc(alt)}" loading="eager">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def page(title: str, body: str, subtitle: str | None = None) -> str:
    sub = paragraph(subtitle, lead=True) if subtitle else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>{sub}{body}</body></html>\n")


@dataclass(frozen=True)
class SpanBar:
    """One span of a trace waterfall: start and duration (ms from the trace's start), depth in the span tree,
    its name and service, and a note (its latency attributes)."""

    start_ms: float
    duration_ms: float
    depth: int
    name: str
    service: str
    note: str = ""


ROW_PX = 24
LABEL_PX = 360
WIDTH_PX = 1100


def waterfall_svg(spans: Sequence[SpanBar], title: str) -> str:
    """A trace's spans as a waterfall: one row per span, indented by depth, a bar from its start for its
    duration on a shared time axis (ms). Scales to the page's width (viewBox); a span's full text is its
    tooltip."""
    if not spans:
        return ""
    end = max(s.start_ms + s.duration_ms for s in spans) or 1.0
    plot = WIDTH_PX - LABEL_PX - 20
    height = ROW_PX * (len(spans) + 1) + 8
    colours: dict[str, str] = {}
    palette = ("#3b73b9", "#d9822b", "#3f9c5a", "#9b59b6", "#c0392b", "#16a085")
    out = [f'<svg class="fig" role="img" aria-label="{esc(title)}" viewBox="0 0 {WIDTH_PX} {height}" '
           f'width="{WIDTH_PX}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
           'font-family="system-ui,sans-serif" font-size="12">']
    for k in range(5):  # time axis: 0, ¼, ½, ¾, end
        x = LABEL_PX + plot * k / 4
        out.append(f'<line x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{height}" stroke="#e2e2e2"/>'
                   f'<text x="{x:.1f}" y="11" text-anchor="middle" fill="#666">{end * k / 4:,.0f} ms</text>')
    for i, s in enumerate(spans):
        y = ROW_PX * (i + 1)
        colour = colours.setdefault(s.service, palette[len(colours) % len(palette)])
        label = f"{'  ' * s.depth}{s.name} [{s.service}]"
        shown = label if len(label) <= 52 else label[:51] + "…"
        x = LABEL_PX + plot * s.start_ms / end
        w = max(plot * s.duration_ms / end, 1.5)
        tip = esc(f"{s.name} [{s.service}] start {s.start_ms:,.1f} ms, {s.duration_ms:,.1f} ms {s.note}".strip())
        after = x + w + 90 < WIDTH_PX  # room for the duration after the bar; else inside its end, in white
        duration = (f'<text x="{x + w + 4:.1f}" y="{y + 15}" fill="#444">' if after else
                    f'<text x="{x + w - 4:.1f}" y="{y + 15}" fill="#fff" text-anchor="end">')
        out.append(f"<g><title>{tip}</title>"
                   f'<text x="{4 + 12 * s.depth}" y="{y + 15}" fill="#222">{esc(shown.strip())}</text>'
                   f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_PX - 8}" rx="2" fill="{colour}"/>'
                   f"{duration}{s.duration_ms:,.1f} ms</text></g>")
    out.append("</svg>")
    return "".join(out)
