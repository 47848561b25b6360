"""The report's page: HTML with inline CSS and a small inline script, nothing fetched from the network.

Every text that comes from a model or a user (layer names, class names, tables) is escaped here or in
:mod:`.widgets`, so a class called ``<script>`` shows as text. The script only shows and hides what
is already on the page (see :mod:`.assets`): without JavaScript the page shows everything.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .assets import CSS, HEAD_SCRIPT, SCRIPT

__all__ = ["Figure", "Section", "page"]


@dataclass
class Figure:
    """A picture in a section: a file under the report folder and its caption."""

    path: str
    caption: str
    alt: str = ""


@dataclass
class Section:
    """One part of the report: a title, paragraphs, label-value rows, pictures, HTML blocks and preformatted text.

    ``blocks`` are pieces of HTML built by :mod:`.widgets` (escaped there), placed after the figures.
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
    blocks: list[str] = field(default_factory=list)


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
    parts += s.blocks
    if s.text is not None:
        parts.append(f"<details><summary>{e(s.text_title)}</summary><pre>{e(s.text)}</pre></details>")
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, subtitle: str, sections: Sequence[Section], *,
         banners: Sequence[tuple[str, str]] = ()) -> str:
    """The whole ``index.html``; each banner (heading, text) opens the page, above everything else.

    Example:
        >>> text = page("r", "m", [Section("a", "<A>", paragraphs=["x < y"])], banners=[("Random weights", "...")])
        >>> "<h2>&lt;A&gt;</h2>" in text and "x &lt; y" in text and '<div class="banner"' in text
        True
    """
    e = html.escape
    top = "".join(f'<div class="banner" role="note"><strong>{e(head)}:</strong> {e(text)}</div>'
                  for head, text in banners)
    nav = " ".join(f'<a href="#{e(s.key)}">{e(s.title)}</a>' for s in sections)
    body = "\n".join(_section(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style><script>{HEAD_SCRIPT}</script></head>\n<body>\n"
            f'{top}<h1>{e(title)}</h1><p class="meta">{e(subtitle)}</p><nav>{nav}</nav>\n{body}\n'
            f"<script>{SCRIPT}</script>\n</body></html>\n")
