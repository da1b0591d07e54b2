"""The documentation runs as written: every Python block and ``$`` command of every page of
docs/, by the rules of tests/test_readme.py (in order, one folder per page); the CLI
reference has a section for every subcommand, and the API reference a page for every public
package."""

from __future__ import annotations

import pkgutil
import re

import pytest
from test_readme import ROOT, Reader, steps

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
STEPS = [step for page in PAGES for step in steps(page)]


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    made: dict = {}

    def reader(page):
        if page not in made:
            made[page] = Reader(page, tmp_path_factory.mktemp(page.stem))
        return made[page]

    return reader


def test_the_docs_have_python_blocks_and_commands_to_run():
    kinds = [step.kind for step in STEPS]
    assert kinds.count("python") >= 8 and kinds.count("command") >= 10


@pytest.mark.parametrize("step", STEPS, ids=[step.id for step in STEPS])
def test_every_block_and_command_of_the_docs_runs_as_written(step, readers):
    readers(step.page).run(step)


def test_the_cli_reference_has_a_section_for_every_subcommand():
    from xdevice.cli import build_parser

    parser = build_parser()
    commands = {
        name
        for action in parser._actions
        for name in getattr(action, "choices", None) or ()
        if action.dest == "command"
    }
    text = (DOCS / "cli.md").read_text()
    assert set(re.findall(r"^## `xdevice ([\w-]+)`$", text, re.M)) == commands
    assert set(re.findall(r"<!-- xdevice-help: ([\w-]+) -->", text)) == commands


def test_the_api_reference_has_a_page_for_every_public_package():
    import xdevice

    public = {
        f"xdevice.{m.name}" for m in pkgutil.iter_modules(xdevice.__path__) if m.ispkg and not m.name.startswith("_")
    }
    public -= {"xdevice.backends"}  # the Backend contract is for backend authors: docs/design.md
    documented = {
        match for page in (DOCS / "api").glob("*.md") for match in re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M)
    }
    assert public | {"xdevice"} == documented
