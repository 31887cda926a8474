"""The lab's wing for many runs: `minitfm runs` (`runs.py`; its runs found by their settings
and grouped in `query.py`, timed in `runs_bench.py`), `minitfm plot` (`plots.py`), `minitfm
sweep` (`sweep.py`, with its grid in `grid.py`, its folder in `sweep_folder.py`, its jobs in
`scheduler.py`, its runs of one shape stacked in `stacking.py`, its results in `results.py` and
each configuration's seeds together in `seeds.py`; on Ray, its jobs as tasks in
`ray_launcher.py`, the cluster joined in `raycluster.py`, run folders sent back in
`rayfolders.py`; with ranges, a search: its ranges read in `space.py`, the search planned in
`search.py`, its trials run in `trials.py` (on Ray: `ray_search.py`), hopeless ones stopped in
`pruning.py`) and `minitfm compare` (`compare.py`, its words in `verdicts.py` and
`conditions.py`); their statistics in `stats.py`. No torch here: many runs are many processes,
each with its own."""
