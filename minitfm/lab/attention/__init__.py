"""The lab's wing for attention pictures: what the heads look at, drawn. In reading order: one
input through the model and how every cross-attention head aligns (`probe.py`); its maps as PNG
figures (`figures.py`), in letters every font can draw (`lettering.py`), as the pictures of
TensorBoard and the GIF (`mapgrid.py`); `minitfm visualize-attention` (`visualize.py`);
attention over training, recorded (`timeline.py`) and drawn (`over_training.py`). It uses the
measuring wing and what the lab shares."""
