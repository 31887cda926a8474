"""minitfm: a toy encoder-decoder transformer trainer you can read in an evening.

The Python API (see `minitfm.app.api`): `from minitfm import load_run, train`, and for
`minitfm learn` `start_workbook`, `check_workbook` and `check`. `import minitfm` stays cheap:
torch loads with the first use of any.

The floors, bottom up (imports go down only, and none up to this file): the kernel (`version`,
`errors`, `catalog`, `yamlfile`, `schema`, `overrides`, `config`), `tasks`, `book`, `fast`,
`learn`, `run`, `lab`, `app`; `__main__` is the `minitfm` command.
"""

from minitfm.version import __version__

API = ("load_run", "train", "start_workbook", "check_workbook", "check")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    """The Python API (`minitfm.load_run`, ...), imported on first use (PEP 562)."""
    if name in API:
        from minitfm.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'minitfm' has no attribute {name!r}")
