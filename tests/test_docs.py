"""The README and docs/: links that resolve, a README that stays short, facts that match."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from minitfm.app.cli import app
from minitfm.config import Config
from tests.helpers import run_cli

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where a `](` is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a page; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = anchor(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The links of a page that point inside the repository (no scheme, no mail)."""
    links = LINK.findall(prose(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


def test_there_are_pages_and_links():
    names = {page.name for page in PAGES}
    assert {"README.md", "config.md", "experiments.md", "operations.md", "speed.md"} <= names
    assert sum(len(relative_links(page)) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for link in relative_links(page):
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name}: {link} names no file"
        if fragment:
            assert target.suffix == ".md", f"{page.name}: {link} has an anchor into no page"
            assert fragment in anchors(target), f"{page.name}: {link} names no heading"


def test_anchor_rule_is_githubs():
    assert anchor("Looking inside: which heads matter") == "looking-inside-which-heads-matter"
    assert anchor("What minitfm refuses, and why") == "what-minitfm-refuses-and-why"
    assert anchor("Distributed training (torchrun)") == "distributed-training-torchrun"
    assert anchor("What `minitfm bench` measures") == "what-minitfm-bench-measures"
    assert anchor("predict: input and output") == "predict-input-and-output"


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_every_page_says_who_it_is_for_and_links_back(page):
    title, blank, first, *_ = page.read_text(encoding="utf-8").splitlines()
    assert title.startswith("# ") and blank == ""
    assert first.startswith("For "), f"{page.name} does not start by saying who it is for"
    opening = page.read_text(encoding="utf-8").split("\n\n")[1]
    assert "](../README.md)" in opening, f"{page.name} does not link back to the README"


def flat_defaults(values: dict, prefix: str = "") -> dict[str, object]:
    """`{"model": {"d_model": 64}}` -> `{"model.d_model": 64}`."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flat_defaults(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def yaml_text(value: object) -> str:
    """A default as the table writes it (YAML's spelling of None and booleans)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_table() -> dict[str, str]:
    """docs/config.md's table of keys: `key` -> its default as written."""
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    section = text.split("## Keys")[1].split("\n## ")[0]
    table = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = line.split(" | ")
        keys = re.findall(r"`([\w.]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        assert len(keys) == len(defaults), line
        table.update(zip(keys, defaults))
    return table


def test_config_page_lists_every_key_with_its_default():
    table = config_table()
    defaults = flat_defaults(Config().model_dump())
    assert set(table) == set(defaults)
    for key, value in defaults.items():
        assert table[key] == yaml_text(value), f"{key}: docs say {table[key]}, code has {value}"


def readme_commands() -> list[tuple[str, list[str]]]:
    """The README's command table: each command with the options its row names."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Commands")[1].split("\n## ")[0]
    rows = []
    for line in section.splitlines():
        match = re.match(r"\| `minitfm ([a-z][\w-]*)", line)
        if match:
            rows.append((match.group(1), sorted(set(re.findall(r"--[a-z][\w-]*", line)))))
    return rows


def test_readme_names_every_command():
    listed = {name for name, _ in readme_commands()}
    assert listed == set(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command, options", readme_commands(),
                         ids=[name for name, _ in readme_commands()])
def test_readme_command_options_exist(command, options):
    result = run_cli(command, "--help")
    assert result.exit_code == 0, result.output
    known = option_names(typer.main.get_command(app).commands[command])
    for option in options:  # whole names: `--open` is not `--open-in-browser`
        assert option in known, f"minitfm {command} has no {option}: {sorted(known)}"


def option_names(command) -> set[str]:
    """Click's own names of a command's options (a group's: its commands' too)."""
    names = {name for param in command.params for name in param.opts + param.secondary_opts}
    for sub in getattr(command, "commands", {}).values():
        names |= option_names(sub)
    return names


def lines_of(*patterns: str) -> int:
    """Lines of the package's files matching the globs (as `wc -l` counts them)."""
    package = ROOT / "minitfm"
    return sum(len(p.read_text(encoding="utf-8").splitlines())
               for pattern in patterns for p in package.glob(pattern))


def test_readme_says_how_long_the_book_is():
    """The README's sizes of the book and the reading list stay within 10% of the files."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    stated = re.search(r"The book is ([\d,]+) lines .*? the reading list is ([\d,]+) lines", text)
    assert stated, "README no longer says how many lines the book is"
    book, reading = (int(n.replace(",", "")) for n in stated.groups())
    actual_book = lines_of("book/*.py")
    actual_reading = actual_book + lines_of("tasks/base.py", "tasks/synthetic.py")
    assert abs(book - actual_book) <= 0.1 * actual_book, (book, actual_book)
    assert abs(reading - actual_reading) <= 0.1 * actual_reading, (reading, actual_reading)
    assert actual_book < 2000, f"the book is {actual_book} lines: more than an evening"


def test_readme_line_counts_of_the_floors_are_current():
    """The code map's line count of each floor (its wings included) stays within 10% of the
    files."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    counts = re.search(r"\(lines: kernel ([\d,]+), (.*?)\)", text)
    assert counts, "README's code map no longer gives the floors' line counts"
    stated = {"kernel": int(counts.group(1).replace(",", ""))}
    for floor, n in re.findall(r"`(\w+)/` ([\d,]+)", counts.group(2)):
        stated[floor] = int(n.replace(",", ""))
    actual = {floor: lines_of(f"{floor}/**/*.py") for floor in stated if floor != "kernel"}
    actual["kernel"] = lines_of("*.py") - lines_of("__init__.py", "__main__.py")
    for floor, n in stated.items():
        assert abs(n - actual[floor]) <= 0.1 * actual[floor], (floor, n, actual[floor])
    assert set(stated) == {"kernel", "tasks", "book", "fast", "learn", "run", "lab", "app"}, stated


def test_figures_of_the_default_run_are_current():
    """Figures of the built-in default that code can produce: its parameter count (the header
    of `minitfm train` prints it) and the number of evaluations of a whole run."""
    from minitfm.fast.model import build_model
    from minitfm.tasks import make_task

    cfg = Config()
    params = sum(p.numel() for p in build_model(cfg, make_task(cfg.task)).parameters())
    explore = " ".join((ROOT / "docs" / "explore.md").read_text(encoding="utf-8").split())
    assert f"reverse.yaml`, {params:,} parameters)" in explore, params
    inside = (ROOT / "docs" / "looking-inside.md").read_text(encoding="utf-8")
    evaluations = cfg.train.steps // cfg.train.eval_every
    assert f"default reverse run at its {evaluations} evaluations" in inside, evaluations
