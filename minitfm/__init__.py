"""minitfm: a toy encoder-decoder transformer trainer you can read in an evening.

The Python API (see `minitfm.app.api`): `from minitfm import load_run, train`, and for
`minitfm learn` `start_workbook`, `check_workbook` and `check`; `load_runs`, every run under a
folder as a table (`minitfm.app.run_table`). `import minitfm` stays cheap: torch loads with the
first use of any but `load_runs`, which needs none.

The floors, bottom up (imports go down only, and none up to this file): the kernel (`version`,
`errors`, `catalog`, `yamlfile`, `schema`, `overrides`, `config`), `tasks`, `book`, `fast`,
`learn`, `run`, `lab`, `app`; `__main__` is the `minitfm` command.
"""

from minitfm.version import __version__

API = ("load_run", "train", "start_workbook", "check_workbook", "check", "load_runs")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    """The Python API (`minitfm.load_run`, ...), imported on first use (PEP 562)."""
    if name == "load_runs":  # no torch: listing runs is instant
        from minitfm.app.run_table import load_runs

        return load_runs
    if name in API:
        from minitfm.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'minitfm' has no attribute {name!r}")
