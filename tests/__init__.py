"""The tests, in the package's folders: minitfm/run/'s in tests/run/, minitfm/lab/watch/'s in
tests/lab/watch/; the kernel's (minitfm/*.py) and the whole project's at the top
(tests/test_suite.py keeps it so)."""
