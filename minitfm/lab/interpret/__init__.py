"""The lab's wing for interpretation by cause: what each head does, shown by changing it. In
reading order: `minitfm ablate`, heads switched off (`ablate.py`); the logit lens (`lens.py`);
`minitfm patch`, activation patching (`patching.py`); the attention patterns a head is named
after (`patterns.py`); `minitfm explain`, a role card per head that joins them (`explain.py`),
and the pictures of explain and patch (`cards.py`). It uses the attention and measuring wings,
never `watch/`."""
