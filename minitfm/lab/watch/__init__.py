"""The lab's wing for watching training: what a run shows while it trains. In reading order: the
gauges read every log.gauge_every steps (`gauges.py`), grokking's own on modular addition
(`grokking.py`) and the figure of its phases (`phases.py`), the forecast made from them
(`forecast.py`) and the tool that checks it over finished runs (`forecast_check.py`);
TensorBoard (`tb.py`, the one importer of tensorboard, its checksum in numpy: `crc32c.py`);
MLflow, with log.mlflow (`tracker.py`, a run logged on a thread of its own; `tracking.py`, which
tracker, whether it answers, its client, a sweep's parent run: the one importer of mlflow, for a
local store; `mlflow_rest.py`, a server's REST API in the standard library). It uses the
attention wing, never `interpret/`."""
