"""The lab's wing for many runs: `minitfm runs` (`runs.py`), `minitfm plot` (`plots.py`) and
`minitfm sweep` (`sweep.py`, with its grid in `grid.py`, its jobs in `scheduler.py` and its
results in `results.py`). No torch here: many runs are many processes, each with its own."""
