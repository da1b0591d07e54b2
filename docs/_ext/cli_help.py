"""An mkdocs hook: ``<!-- xdevice-help: COMMAND -->`` in a page becomes that command's ``--help``.

The CLI reference shows each subcommand's flags as ``xdevice COMMAND --help`` prints them,
read from ``xdevice.cli.build_parser()`` when the site is built, so the page cannot drift
from the parser. A marker naming no subcommand fails the build, and so does a subcommand
the page has no marker for. Loaded by path from mkdocs.yml (``hooks:``).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

MARKER = re.compile(r"<!-- xdevice-help: ?([\w-]*) -->")
WIDTH = "96"  # argparse wraps to $COLUMNS


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if not MARKER.search(markdown):
        return markdown
    from xdevice.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    named = set(MARKER.findall(markdown)) - {""}
    if named - set(commands) or set(commands) - named:
        raise ValueError(
            f"{page.file.src_path}: the help markers name {sorted(named)}; the subcommands are "
            f"{sorted(commands)}: add or remove `<!-- xdevice-help: COMMAND -->` markers to match"
        )

    def help_text(match: re.Match) -> str:
        name = match.group(1)
        previous = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = WIDTH
        try:
            text = (commands[name] if name else parser).format_help()
        finally:
            if previous is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = previous
        return f"```text\n{text.rstrip()}\n```"

    return MARKER.sub(help_text, markdown)
