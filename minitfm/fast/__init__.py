"""The speed appendix, read after the book: the same model, computed faster.

`model.py` builds the model a config's `model.code` names (`build_model`): the book's own
code, or the book's model with this appendix installed: `kernels.py`, attention and layer norm
with their backward passes written out, and `packing.py`, position-wise work on the real tokens
only. Same classes, same parameters, same `state_dict`; each piece is tested equal to the
book's readable form. `stack.py` trains many runs of one shape as one stacked model (vmap) and
decodes them together. What each one trades, and the measurements, are in docs/speed.md.
"""
