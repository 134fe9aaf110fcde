"""HTML pieces every report section uses: escaped text, formatted numbers, tables, figures, "no data"."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

_SCHEME = re.compile(r"\b([a-z])([a-z0-9+.-]*:)(?=&#47;|//)", re.IGNORECASE)


def esc(value: Any) -> str:
    """HTML-escaped text in which no address survives literally.

    Stored text (an error message, a build string) may quote an address; it is shown as written, but with
    `://` and the scheme's second letter as character references, so nothing in the file reads (or is
    followed) as a link.
    """
    text = html.escape("" if value is None else str(value), quote=True).replace("://", ":&#47;&#47;")
    return _SCHEME.sub(lambda m: f"{m.group(1)}&#{ord(m.group(2)[0])};{m.group(2)[1:]}", text)


def fmt(value: Any, digits: int = 3) -> str:
    """A number with a few significant digits, thousands separated; blanks for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        v = float(value)
        if v != 0 and abs(v) >= 10**digits:
            return f"{v:,.0f}"
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.2e}"
        return f"{v:.{digits}g}"
    return esc(value)


def pct(value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "", raw: bool = False) -> str:
    """An HTML table. Cells are escaped text, numbers formatted right-aligned; `raw=True` trusts str cells."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for v in row:
            if isinstance(v, int | float) and not isinstance(v, bool):
                cells.append(f'<td class="num">{fmt(v)}</td>')
            elif raw and isinstance(v, str):
                cells.append(f"<td>{v}</td>")
            else:
                cells.append(f"<td>{fmt(v) if isinstance(v, bool) or v is None else esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = f' class="{cls}"' if cls else ""
    rows_html = "".join(body)
    return (
        f'<div class="wrap"><table{klass}><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows_html}</tbody></table></div>"
    )


def figure(uri: str, name: str, caption: str, attrs: dict[str, str] | None = None) -> str:
    """A plot with its caption; `attrs` adds data-* attributes (e.g. where its labels landed)."""
    extra = "".join(f' {k}="{esc(v)}"' for k, v in (attrs or {}).items())
    return (
        f'<figure class="plot" data-plot="{esc(name)}"{extra}><img src="{uri}" alt="{esc(caption)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def nodata(what: str) -> str:
    return f'<p class="nodata">No {esc(what)} in the selected runs.</p>'


def interval_text(interval: Any, coverage: Any) -> str:
    """A cross-validated interval on measured / predicted, e.g. "0.93-1.12 (80%)" ("" when none)."""
    if not isinstance(interval, tuple | list) or len(interval) != 2:
        return ""
    cover = f" ({coverage:.0%})" if isinstance(coverage, int | float) else ""
    return f"{interval[0]:.2f}-{interval[1]:.2f}{cover}"
