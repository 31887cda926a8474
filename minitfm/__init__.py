"""minitfm: a toy encoder-decoder transformer trainer you can read in an evening.

The Python API (see `minitfm.app.api`): `from minitfm import load_run, train`. `import minitfm`
stays cheap: torch loads with the first use of either.
"""

__version__ = "0.1.0"
__all__ = ["load_run", "train", "__version__"]


def __getattr__(name: str):
    """`minitfm.load_run` and `minitfm.train` (the Python API), imported on first use (PEP 562)."""
    if name == "load_run":
        from minitfm.app.api import load_run

        return load_run
    if name == "train":
        from minitfm.app.api import train

        return train
    raise AttributeError(f"module 'minitfm' has no attribute {name!r}")
