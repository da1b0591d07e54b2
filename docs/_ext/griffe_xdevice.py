"""Two griffe extensions for the API pages (loaded by path from mkdocs.yml; nothing imports this).

``DoctestBlocks``: a docstring's ``>>>`` examples become code blocks. The docstrings put
their short examples anywhere (the style guide asks for one on every public function), not
only under a Google ``Examples:`` heading, which griffe already renders as code. Left alone,
Markdown reads ``>>> f(x)[:1]`` as a quote holding a link, so each run of ``>>>`` lines and
the output under it is fenced as ``pycon``, doctest flags (``# doctest: +SKIP``) dropped.

``LazyExports``: a public package that loads a name on first use (``xdevice.fit``,
``xdevice.training.Trainer``, ``xdevice.serving.Server``: a module ``__getattr__``, so that
``import xdevice`` stays light) lists it in ``__all__`` without defining it, which griffe,
reading the source, cannot follow. The package is imported (none of them imports a
framework), each such name looked up once, and documented where it is defined. A name that
is also a submodule's (``xdevice.converters.export``, the function, beside the module
``converters/export.py`` that defines it) is the function for the reader too: griffe keeps
the submodule under the name, so the submodule is filed under another key and the name
documents what ``from xdevice.converters import export`` gives.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

FLAG = re.compile(r"\s*#\s*doctest:.*$")
HEADING = re.compile(r"^(\w[\w ]*):\s*$")


def fence_examples(text: str) -> str:
    """Fence every run of ``>>>`` lines (with the output that follows it) as ``pycon``.

    >>> fence_examples("Lists them.\\n\\n>>> f()  # doctest: +SKIP\\n[1]").splitlines()[2:]
    ['```pycon', '>>> f()', '[1]', '```']
    """
    lines, out, index = text.split("\n"), [], 0
    fenced, section = False, ""
    while index < len(lines):
        line = lines[index]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced and line and not line[0].isspace():
            heading = HEADING.match(line)
            section = heading.group(1) if heading else ""
        if fenced or not stripped.startswith(">>>") or section in ("Example", "Examples"):
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        while index < len(lines) and lines[index].strip():
            out.append(FLAG.sub("", lines[index]))
            index += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence the ``>>>`` examples of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_examples(obj.docstring.value)


class LazyExports(griffe.Extension):
    """Document a package's lazily loaded ``__all__`` names where they are defined."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        if not (mod.is_init_module and mod.path.startswith("xdevice")):
            return  # only packages (importing one runs no command and loads no framework)
        missing = [str(name) for name in mod.exports or () if str(name) not in mod.members]
        if not missing:
            return  # everything is imported statically: nothing to run
        live = importlib.import_module(mod.path)
        for name in missing:
            value = getattr(live, name)
            home = getattr(value, "__module__", None)
            if home and home != mod.path:
                mod.set_member(name, griffe.Alias(name, f"{home}.{getattr(value, '__qualname__', name)}", parent=mod))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "xdevice":
            return
        for mod in _init_modules(pkg):
            for name in map(str, mod.exports or ()):
                member = mod.members.get(name)
                if member is None or member.is_alias or not member.is_module:
                    continue
                value = getattr(importlib.import_module(mod.path), name)
                if inspect.ismodule(value):
                    continue
                key = f"_{name}_module"  # the submodule's path stays mod.path + name: only its key moves
                mod.members[key] = mod.members.pop(name)
                _retarget(pkg, f"{mod.path}.{name}.", f"{mod.path}.{key}.")
                target = f"{mod.path}.{key}.{value.__qualname__}" if value.__module__ == member.path else None
                mod.set_member(
                    name, griffe.Alias(name, target or f"{value.__module__}.{value.__qualname__}", parent=mod)
                )


def _init_modules(mod: griffe.Module) -> list[griffe.Module]:
    found = [mod] if mod.is_init_module else []
    for member in list(mod.members.values()):
        if not member.is_alias and member.is_module:
            found += _init_modules(member)
    return found


def _retarget(obj: griffe.Object, old: str, new: str) -> None:
    """Point every alias under ``obj`` whose target lies under ``old`` to ``new`` instead."""
    for member in obj.members.values():
        if member.is_alias:
            if member.target_path.startswith(old):
                member.target_path = new + member.target_path[len(old) :]
        elif member.is_module or member.is_class:
            _retarget(member, old, new)
