"""minitfm: a toy encoder-decoder transformer trainer you can read in an afternoon."""

__version__ = "0.1.0"
