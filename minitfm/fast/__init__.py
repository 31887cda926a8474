"""The speed appendix, read after the book: the kernels and the packing the book calls.

`kernels.py` holds attention and layer norm with their backward passes written out, and a
softmax for short rows; `packing.py` lets position-wise work skip the padding. Each is tested
equal to the book's readable form. Nothing here knows the model: it imports only torch. What
each one trades, and the measurements, are in docs/speed.md.
"""
