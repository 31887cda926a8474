"""The lab's measuring wing: `minitfm eval` and `predict` (`evaluate.py`), `minitfm bench`
(`bench.py`) and the plain trainers it races (`reference.py`). It uses only what the lab shares."""
