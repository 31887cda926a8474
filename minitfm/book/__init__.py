"""The book: a transformer in seven short chapters, read in this order, and the code that runs.

1. `attention.py`   attention in a few lines (Vaswani et al. 2017, §3.2), the KV cache,
                    multi-head attention with a hook point over the heads
2. `layers.py`      layer norm, dropout, the feed-forward block
3. `positions.py`   where each token is: sinusoidal, learned, RoPE, ALiBi, none
4. `model.py`       encoder and decoder layers, masks, the model, greedy decoding
5. `optim.py`       AdamW written out (Loshchilov & Hutter 2019)
6. `loop.py`        the lr schedule, one training step, the loop, early stopping
7. `metrics.py`     honest metrics: greedy decoding, exact match, per length

The data these chapters learn from is `minitfm/tasks/` (`base.py`, `synthetic.py`).

What you may change: anything. With `model.code=book` (`minitfm train model.code=book`) a run
trains this code as written, so an edit here shows in the next run; `make test-book` checks the
chapters against PyTorch in seconds. The default, `model.code=fast`, installs the speed
appendix (`minitfm/fast/`) on this same model: the same parameters, each piece tested equal
to the readable one here. Nothing in the book is about machines: devices, processes and the
cadence of logs and saves are `minitfm/run/`'s, speed is `minitfm/fast/`'s.
"""
