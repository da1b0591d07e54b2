"""Progress for long commands: a live ``tqdm`` bar on a terminal, plain lines otherwise (a
log file or CI keeps one line per step instead of carriage returns). Both go to stderr, so
a command's output (a table, JSON) stays clean on stdout."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], what: str) -> Iterator[T]:
    """``items``, reporting each as it starts: ``what: item (i/n)``."""
    items = list(items)
    if sys.stderr.isatty():
        from tqdm import tqdm

        with tqdm(items, desc=what, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
            for item in bar:
                bar.set_postfix_str(str(item))
                yield item
        return
    for index, item in enumerate(items, 1):
        print(f"{what}: {item} ({index}/{len(items)})", file=sys.stderr, flush=True)
        yield item


def step(text: str) -> None:
    """One line saying what a long single step is doing (an export, a conversion)."""
    print(f"{text}...", file=sys.stderr, flush=True)
