"""The lab's wing for looking inside a model, read in this order: one input through the model
and how every cross-attention head aligns (`probe.py`); its maps as PNG figures (`figures.py`),
as TensorBoard's pictures (`mapgrid.py`), in letters every font can draw (`lettering.py`);
`minitfm visualize-attention` (`visualize.py`); attention over training (`timeline.py`,
`over_training.py`); the gauges read while a run trains (`gauges.py`), the forecast made from
them (`forecast.py`) and how well it forecasts over finished runs (`forecasts.py`); TensorBoard
(`tb.py`); `minitfm ablate` (`ablate.py`); `minitfm explore` (`explorer.py`, with its page in
`explore/`). It may use the measuring wing, never `many/`."""
