"""How minitfm starts a Python process of its own (a sweep's commands, the bench's trainers).

`python -P -m MODULE`: with -P (Python 3.11) the working folder is not put first on the child's
`sys.path`, as `python -m` otherwise does, so a `minitfm/` package or a `tqdm.py` lying where the
command runs is never imported in place of the installed one (a shared folder can hold anyone's
files). The same `sys.executable` runs it: the same installation, the same minitfm.
"""

from __future__ import annotations

import sys


def python_module(module: str) -> list[str]:
    """The command that runs `module` (`minitfm`, say) as `python -m` does, in safe-path mode."""
    return [sys.executable, "-P", "-m", module]
