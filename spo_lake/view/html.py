"""HTML pieces for `spolake view`: pure functions from values to markup, every piece of data escaped.

Nothing from a lake is trusted: text goes through `esc` (html.escape, quotes included), data for charts goes into a
`<script type="application/json">` block with `<`, `>` and `&` written as JSON escapes (so a `</script>` inside a
string cannot close the block), and the page's own script reads it with JSON.parse and sets only `textContent`.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PLOTLY_JS = "assets/plotly.min.js"
CSS = "assets/site.css"
SCRIPT = "assets/site.js"


def esc(value: Any) -> str:
    """`value` as text inside HTML (element content or a quoted attribute); None is an en dash."""
    return "–" if value is None else html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A cell's text: floats to 4 significant places, lists joined, None as an en dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    return str(value)


def json_script(element_id: str, data: Any) -> str:
    """`data` as JSON in an inert script block; <, > and & are JSON escapes, so no string can end the block."""
    text = json.dumps(data, default=str, allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def slug(key: str) -> str:
    """A file name for an id from the lake: its safe characters (for reading) and a hash (so two ids never share a
    file, and nothing like '../' survives)."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", key)[:60].strip("_")
    return f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class Link:
    """A cell that links `href` (a site-relative path the site writes) with `text`."""

    text: Any
    href: str


def cell(value: Any, root: str) -> str:
    if isinstance(value, Link):
        return f'<a href="{esc(root + value.href)}">{esc(fmt(value.text))}</a>'
    return esc(fmt(value))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], root: str = "", cls: str = "") -> str:
    """A plain HTML table; a cell is a value or a `Link`."""
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v, root)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def chart(element_id: str, traces: list[dict[str, Any]], layout: dict[str, Any]) -> str:
    """A plotly chart: a div the site script draws into from the JSON block next to it (plotly.js is loaded once
    per page from the site's assets, never per chart)."""
    return (f'<div class="chart" id="{esc(element_id)}" data-chart="{esc(element_id)}-data"></div>'
            + json_script(f"{element_id}-data", {"data": traces, "layout": layout}))


def pager(page: int, pages: int, name: str) -> str:
    """Links to the previous and next page of a listing written as name(0), name(1), ... (relative to the page)."""
    if pages <= 1:
        return ""
    parts = [f'<a href="{esc(name_at(name, page - 1))}">← previous</a>' if page > 0 else "",
             f"page {page + 1} of {pages}",
             f'<a href="{esc(name_at(name, page + 1))}">next →</a>' if page + 1 < pages else ""]
    return '<p class="pager">' + " · ".join(p for p in parts if p) + "</p>"


def name_at(name: str, page: int) -> str:
    """File name of page `page` of a listing `name` (the first page is name.html itself)."""
    return f"{name}.html" if page == 0 else f"{name}-{page + 1}.html"


def page(title: str, body: str, root: str, charts: bool = False) -> str:
    """A whole page; `root` is the relative path back to the site's top ('' or '../')."""
    plotly = f'<script src="{root}{PLOTLY_JS}"></script>' if charts else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<link rel="stylesheet" href="{root}{CSS}">{plotly}
</head><body>
<nav><a href="{root}index.html">lake overview</a> · <a href="{root}prompts/index.html">prompts</a> ·
<a href="{root}runs/index.html">runs</a></nav>
<h1>{esc(title)}</h1>
{body}
<script src="{root}{SCRIPT}"></script>
</body></html>
"""
