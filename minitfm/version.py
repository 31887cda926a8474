"""minitfm's version, at the bottom of the kernel: any floor may read it, none imports up."""

__version__ = "0.1.0"
