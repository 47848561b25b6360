"""The report's page: plain HTML and inline CSS, no JavaScript and no network resources.

Every text that comes from a model or a user (layer names, class names, tables) is escaped here,
so a class called ``<script>`` shows as text.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Figure", "Section", "page"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
nav a{margin-right:1rem}figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9rem}pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;font-size:.8rem}
table.kv td,table.kv th{padding:.15rem .8rem .15rem 0;text-align:left}.warn{color:#a40000;font-weight:600}
.ok{color:#176f2c;font-weight:600}.meta{color:#555}
"""


@dataclass
class Figure:
    """A picture in a section: a file under the report folder and its caption."""

    path: str
    caption: str
    alt: str = ""


@dataclass
class Section:
    """One part of the report: a title, paragraphs, key-value rows, pictures and preformatted text.

    ``data`` goes to ``report.json`` under the section's ``key``.
    """

    key: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    text: str | None = None
    text_title: str = "table"
    warning: str | None = None
    data: Any = None


def _section(s: Section) -> str:
    e = html.escape
    parts = [f'<section id="{e(s.key)}"><h2>{e(s.title)}</h2>']
    if s.warning:
        parts.append(f'<p class="warn">{e(s.warning)}</p>')
    parts += [f"<p>{e(p)}</p>" for p in s.paragraphs]
    if s.facts:
        rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in s.facts)
        parts.append(f'<table class="kv">{rows}</table>')
    for f in s.figures:
        parts.append(f'<figure><img src="{e(f.path)}" alt="{e(f.alt or f.caption)}">'
                     f"<figcaption>{e(f.caption)}</figcaption></figure>")
    if s.text is not None:
        parts.append(f"<details><summary>{e(s.text_title)}</summary><pre>{e(s.text)}</pre></details>")
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole ``index.html``.

    Example:
        >>> text = page("r", "m", [Section("a", "<A>", paragraphs=["x < y"])])
        >>> "<h2>&lt;A&gt;</h2>" in text and "x &lt; y" in text and "<script" not in text
        True
    """
    e = html.escape
    nav = " ".join(f'<a href="#{e(s.key)}">{e(s.title)}</a>' for s in sections)
    body = "\n".join(_section(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            f'<h1>{e(title)}</h1><p class="meta">{e(subtitle)}</p><nav>{nav}</nav>\n{body}\n</body></html>\n')
