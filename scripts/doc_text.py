"""Text helpers of the document generators (benchmarks_headline.py, host_settings.py, gpu_report.py,
training_report.py): generated prose is wrapped, so that no line of a document grows past what a diff can show."""

from __future__ import annotations

import textwrap

WIDTH = 118


def wrap(markdown: str, width: int = WIDTH) -> str:
    """Wrap the prose lines of `markdown` (paragraphs, list items, quotes) at `width`; leave tables, headings, code
    fences and HTML comments as they are (Markdown joins a paragraph's lines again)."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("```", "|", "#", "<!--")) or len(line) <= width:
            out.append(line)
            continue
        indent = "  " if line.startswith(("- ", "  ")) else "> " if line.startswith("> ") else ""
        out.append(textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False))
    return "\n".join(out)
