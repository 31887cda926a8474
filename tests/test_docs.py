"""The README and docs/: links that resolve, a README that stays short, facts that match."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from minitfm.app.cli import app
from minitfm.config import Config, load_config
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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_package_files_and_tools_a_page_names_are_there(page):
    """A file of the package a page names (`minitfm/lab/watch/gauges.py`) is there, and a tool
    it runs (`python -m minitfm.lab.watch.forecast_check`) is a module: rooms move."""
    text = page.read_text(encoding="utf-8")
    for path in re.findall(r"(?<![\w/.])(minitfm/[\w/.]*\w)", text):
        assert (ROOT / path).exists(), f"{page.name} names {path}, which is not there"
    for name in re.findall(r"python -m (minitfm[\w.]*\w)", text):
        assert importlib.util.find_spec(name) is not None, f"{page.name} runs {name}: no module"


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
    commands = typer.main.get_command(app).commands
    assert listed == {name for name, command in commands.items() if not command.hidden}


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
    """The README's sizes of the book and the reading list, to the hundred (a figure to the
    line went stale with every edit), stay within 10% of the files."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    stated = re.search(r"The book is about ([\d,]+) lines .*? the reading list is about "
                       r"([\d,]+) lines", text)
    assert stated, "README no longer says how many lines the book is"
    book, reading = (int(n.replace(",", "")) for n in stated.groups())
    assert book % 100 == 0 and reading % 100 == 0, (book, reading)
    actual_book = lines_of("book/*.py")
    actual_reading = actual_book + lines_of("tasks/base.py", "tasks/synthetic.py")
    assert abs(book - actual_book) <= 0.1 * actual_book, (book, actual_book)
    assert abs(reading - actual_reading) <= 0.1 * actual_reading, (reading, actual_reading)
    assert actual_book < 2000, f"the book is {actual_book} lines: more than an evening"


def test_the_maps_line_counts_of_the_floors_are_current():
    """The code map's line count of each floor (its wings included) is the files' count to the
    hundred, as it says: within 50 lines of it (a stated 800 for 875 lines is stale)."""
    text = " ".join((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split())
    counts = re.search(r"\(lines, to the hundred: kernel ([\d,]+), (.*?)\)", text)
    assert counts, "docs/architecture.md's code map no longer gives the floors' line counts"
    stated = {"kernel": int(counts.group(1).replace(",", ""))}
    for floor, n in re.findall(r"`(\w+)/` ([\d,]+)", counts.group(2)):
        stated[floor] = int(n.replace(",", ""))
    actual = {floor: lines_of(f"{floor}/**/*.py") for floor in stated if floor != "kernel"}
    actual["kernel"] = lines_of("*.py") - lines_of("__init__.py", "__main__.py")
    for floor, n in stated.items():
        assert n % 100 == 0 and abs(n - actual[floor]) <= 50, (floor, n, actual[floor])
    assert set(stated) == {"kernel", "tasks", "book", "fast", "learn", "run", "lab", "app"}, stated


def test_the_map_names_every_room_of_the_package():
    """docs/architecture.md's code map names every module and subpackage of minitfm/, under its
    package's line or below it, so that the map is the rooms (the README's went stale when
    app/console.py was split)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```\nminitfm/\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    package = ROOT / "minitfm"
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts or path.name in ("__init__.py", "__main__.py") and \
                path.parent != package:
            continue
        parts = path.relative_to(package).parts
        start = 0
        for folder in parts[:-1]:  # the package's own line, then its rooms below it
            start = next((i for i, line in enumerate(lines[start:], start)
                          if f"{folder}/" in line), None)
            assert start is not None, f"the map does not name {folder}/ (for {path.name})"
        assert any(re.search(rf"\b{re.escape(path.name)}\b", line) for line in lines[start:]), \
            f"the map does not name {'/'.join(parts)}"


def test_figures_of_the_default_run_are_current():
    """Figures of the built-in default that code can produce: its parameter count (the header
    of `minitfm train` prints it) and the number of attention snapshots of a whole run."""
    from minitfm.fast.model import build_model
    from minitfm.tasks import make_task

    cfg = Config()
    params = sum(p.numel() for p in build_model(cfg, make_task(cfg.task)).parameters())
    explore = " ".join((ROOT / "docs" / "explore.md").read_text(encoding="utf-8").split())
    assert f"reverse.yaml`, {params:,} parameters)" in explore, params
    inside = (ROOT / "docs" / "looking-inside.md").read_text(encoding="utf-8")
    snapshots = len(figures()["default"]["snapshots"])  # every 25 steps, and where it stopped
    every, stopped = cfg.log.attention_every, figures()["default"]["stopped"]["step"]
    assert snapshots == len(range(every, stopped, every)) + 1
    assert f"default reverse run at its {snapshots} snapshots" in inside, snapshots


def test_the_rates_of_training_longer_are_the_schedules():
    """docs/config.md's "Training a run longer" quotes the default run's rate where seed 0
    stops, under its own schedule and under train.steps=3000, and the suggestion a resume
    gives."""
    from minitfm.run.resume import schedule_jump

    cfg, stopped = Config(), figures()["default"]["stopped"]["step"]
    longer = cfg.train.model_copy(update={"steps": 3000})
    note = schedule_jump({"step": stopped, "best_exact_match": 0.5}, cfg.train, longer, None)
    page = " ".join((ROOT / "docs" / "config.md").read_text(encoding="utf-8").split())
    was, will = note.split("from ")[1].split(" at step")[0].split(" up to ")
    assert f"at step {stopped}, where seed 0 stops, it would jump from {was} to {will}," in page, \
        note
    assert f"`train.schedule=constant train.lr={was}`" in page, note


# --- figures that `make figures` measures (docs/make_figures.py writes docs/figures.json) ---

FIGURES = ROOT / "docs" / "figures.json"


def figures() -> dict:
    return json.loads(FIGURES.read_text(encoding="utf-8"))


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def flat(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def test_readme_quotes_the_default_runs_figures():
    """The training run of the README's tour: exact match at each of the default run's
    evaluations, where it stops (the README once said 12-22% at step 100 where it made 11.6%)."""
    default = figures()["default"]
    text = flat(ROOT / "README.md")
    item = text[text.index("**The training run**"):text.index("**The attention maps**")]
    quoted = dict((step, value) for value, step in re.findall(r"(\d+\.\d%) at (?:step )?(\d+)",
                                                              item))
    assert quoted == {step: percent(em) for step, em in default["evaluations"].items()}, quoted
    stop = default["stopped"]
    assert f"stops at {percent(stop['exact_match'])} at step {stop['step']}," in item


def test_looking_inside_quotes_the_default_runs_snapshots():
    """The table under the over-training strip: the best aligned head's exact match, alignment
    and entropy at each snapshot of the default run."""
    default = figures()["default"]
    text = (ROOT / "docs" / "looking-inside.md").read_text(encoding="utf-8")
    after = text[text.index("(over-training-reverse.png)"):]
    table = re.search(r"^\| step \|.*?(?=\n\n)", after, re.S | re.M).group(0)
    rows = {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines())}
    snapshots = default["snapshots"]
    assert rows["step"] == [str(s["step"]) for s in snapshots]
    assert rows["exact match"] == [percent(s["exact_match"]) if s["exact_match"] is not None
                                   else "–" for s in snapshots]  # – : no evaluation there
    assert rows["alignment score"] == [f"{s['alignment']:.2f}" for s in snapshots]
    assert rows["entropy (nats)"] == [f"{s['entropy']:.2f}" for s in snapshots]
    layer, head = default["best_head"]
    prose = " ".join(after.split())
    assert f"layer {layer}, head {head}, the best aligned head at the end" in \
        " ".join(text.split())
    assert f"The run stops at step {default['stopped']['step']}," in " ".join(text.split())
    assert prose  # the table follows the strip


def test_the_shipped_configs_table_quotes_their_runs():
    """docs/config.md's table of shipped configs: each run that figures.json has (all of them
    once `make figures` has run; grokking.yaml's from its step `grokking`), and the dates run
    as docs/own-data.md quotes it."""
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    table = dict((name, (em, step)) for name, em, step in
                 re.findall(r"^\| `(\w+\.yaml)`[^|]*\| ([\d.]+%) \| (\d+) \|$", text, re.M))
    assert len(table) == 8, table
    runs = {**figures()["configs"]}
    if "grokking" in figures():  # its own step of make figures, which draws its phases
        runs["grokking.yaml"] = figures()["grokking"]["stopped"]
    for name, run in runs.items():
        assert table[name] == (percent(run["exact_match"]), str(run["step"])), name
    em, step = table["dates.yaml"]
    assert f"{em} exact match on the 1,000 held-out dates at step {step}" in \
        flat(ROOT / "docs" / "own-data.md")


def test_the_lengthgen_table_quotes_the_sweep_once_make_figures_has_run_it():
    """docs/experiments.md's first length-generalisation table against the sweep that `make
    figures` runs (it takes most of its time): each row's overrides, each task's ranges."""
    runs = figures().get("lengthgen")
    if runs is None:
        pytest.skip("docs/figures.json has no lengthgen sweep yet: make figures runs it")
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    table = text[text.index("| overrides after `configs/lengthgen-copy.yaml`"):]
    table = table[:table.index("\n\n")].splitlines()[2:]
    assert len(table) == len(runs) // 2, table
    for line in table:
        label, *cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        overrides = dict(item.split("=") for item in re.findall(r"[\w.]+=\S+?(?=[ `])", label))
        scheme = overrides.get("model.positional", "sinusoidal")
        spread = overrides.get("model.random_positions")
        for task, (inside, beyond) in zip(("copy", "reverse"), (cells[:2], cells[2:]),
                                          strict=True):
            (run,) = [r for r in runs if r["task"] == task and r["positional"] == scheme and
                      str(r["random_positions"]) == str(spread or None)]
            em = run["exact_match"]
            assert inside == percent(em["1..16"]), (label, task)
            assert beyond == f"{percent(em['17..32'])} ({percent(em['17..24'])})", (label, task)


def test_make_figures_remakes_every_picture_of_docs_and_figures_json():
    """`make figures` runs docs/make_figures.py; its commands (--dry-run) write every picture
    in docs/ and figures.json, and run the notebook as `make notebook` does."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^figures: .*\n\t\$\(BIN\)/python docs/make_figures.py", makefile, re.M)
    result = subprocess.run([sys.executable, "docs/make_figures.py", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    written = re.findall(r"-> (docs/\S+\.png)", result.stdout)
    assert sorted(written) == sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.png"))
    assert "write docs/figures.json" in result.stdout
    assert "python notebooks/execute.py" in result.stdout


def test_figures_json_is_what_make_figures_writes(tmp_path):
    """The entries of docs/figures.json have the shape make_figures.py's readers give a run."""
    import importlib.util

    from minitfm.app.api import train_run
    from tests.helpers import TINY

    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "docs" / "make_figures.py")
    make_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_figures)
    recorded = [item for item in TINY if not item.startswith("log.attention_every")]
    run_dir = tmp_path / "run"
    train_run(load_config(None, [*recorded, "train.steps=20", "train.eval_every=10",
                                 "log.attention_every=5",  # as the default: some between
                                 "log.tensorboard=false"]), run_dir=run_dir)

    def shape(value):
        if isinstance(value, dict):
            return {k if not k.isdigit() else "step": shape(v) for k, v in value.items()}
        return [shape(value[0])] if isinstance(value, list) and value else type(value).__name__

    shipped = figures()
    assert shape(make_figures.run_figures(run_dir)) == shape(shipped["default"])
    assert shape(make_figures.where_it_stopped(run_dir)) == \
        shape(next(iter(shipped["configs"].values())))


def test_the_notebooks_pointers_lead_somewhere():
    """notebooks/tour.ipynb's links resolve, and a section it says is the README's is one (it
    sent readers to the README's Length generalisation section, which is in experiments.md)."""
    import nbformat

    notebook = ROOT / "notebooks" / "tour.ipynb"
    text = "\n".join(cell.source for cell in nbformat.read(notebook, as_version=4).cells
                     if cell.cell_type == "markdown")
    links = [link for link in LINK.findall(prose(text)) if not re.match(r"[a-z]+:", link)]
    assert links, "the notebook links nowhere"
    for link in links:
        path, _, fragment = link.partition("#")
        target = (notebook.parent / path).resolve()
        assert target.is_file(), link
        assert not fragment or fragment in anchors(target), link
    readme = {anchor(h) for h in re.findall(r"\*([^*]+)\* section", " ".join(text.split()))}
    assert readme <= anchors(ROOT / "README.md"), readme


def test_grokking_section_quotes_make_figures_run():
    """docs/looking-inside.md's "Grokking on a laptop" against figures.json `grokking`: where
    each phase ended, where the run stopped, the gauges it quotes at the boundaries."""
    run = figures().get("grokking")
    if run is None:
        pytest.skip("docs/figures.json has no grokking run yet: make figures runs it")
    text = flat(ROOT / "docs" / "looking-inside.md")
    section = text[text.index("## Grokking on a laptop"):text.index("## TensorBoard")]
    memorised, jump, grokked = (run["phases"][k] for k in ("memorised", "jump_begins", "grokked"))
    for phase in (f"**Memorisation** (steps 0-{memorised})",
                  f"**Circuit formation** ({memorised}-{jump})",
                  f"**Cleanup** ({jump}-{grokked})",
                  f"| {memorised} | {grokked} ({percent(run['stopped']['exact_match'])}) |"):
        assert phase in section, phase
    gauges = run["gauges"]
    for phase, name in (("memorised", "restricted_loss"), ("jump_begins", "restricted_loss"),
                        ("memorised", "fourier_sparsity"), ("jump_begins", "fourier_sparsity"),
                        ("grokked", "fourier_sparsity")):
        assert f"{gauges[phase][name]:.2f}" in section, (phase, name)


def test_the_grokking_steps_say_they_repeat_on_one_cpu_and_torch_build_only():
    """A newcomer's seed 0 of configs/grokking.yaml grokked at step 4200, not the 5020 quoted:
    another CPU rounds differently. Every claim that the run repeats step for step (or bit for
    bit), in the section and in the config's comments, says on what."""
    text = flat(ROOT / "docs" / "looking-inside.md")
    section = text[text.index("## Grokking on a laptop"):text.index("## TensorBoard")]
    assert "only on the same CPU and torch build" in section
    comments = " ".join(line.partition("#")[2].strip() for line in
                        (ROOT / "configs" / "grokking.yaml").read_text().splitlines()
                        if "#" in line)
    claims = [sentence for prose in (section, comments) for sentence in prose.split(". ")
              if re.search(r"(step for step|bit for bit)", sentence)]
    assert len(claims) >= 3, claims  # the section's two, the config's one
    for sentence in claims:
        assert "same CPU and torch build" in sentence, sentence
