"""Comparison reports: one self-contained HTML file with plots, or a Markdown summary.

Renderers are pure (`render_html`, `render_markdown`: ReportData in, text out); `load_report_data` reads a
store into ReportData; `write_report` puts the text in place atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import UserError
from .data import ReportData, load_report_data

FORMATS = ("html", "md")


def render(data: ReportData, fmt: str) -> str:
    """The report text in `fmt` (html or md)."""
    if fmt == "html":
        from .html import render_html

        return render_html(data)
    if fmt == "md":
        from .markdown import render_markdown

        return render_markdown(data)
    raise UserError(f"--format {fmt!r}: use html or md")


SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}


def format_for(out: Path, fmt: str | None) -> str:
    """The format asked for, or the one the output file's suffix implies (no suffix: html).

    A suffix that names neither format (report.pdf) is refused rather than filled with HTML, unless
    --format says what to write."""
    if fmt:
        if fmt not in FORMATS:
            raise UserError(f"--format {fmt!r}: use html or md")
        return fmt
    suffix = out.suffix.lower()
    if suffix and suffix not in SUFFIXES:
        raise UserError(
            f"--out {out}: reports are HTML (.html) or Markdown (.md), not {out.suffix} "
            "(or name the format with --format html|md)"
        )
    return SUFFIXES.get(suffix, "html")


def write_report(text: str, out: Path) -> None:
    """Write atomically (temp file + rename), creating the folder, so a reader never sees half a report."""
    if out.exists() and out.is_dir():
        raise UserError(f"--out {out}: is a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write: {exc.strerror}") from None


__all__ = ["FORMATS", "ReportData", "format_for", "load_report_data", "render", "write_report"]
