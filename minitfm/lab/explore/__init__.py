"""The lab's wing for the explorer, `minitfm explore`: a run in one offline page. `explorer.py`
gathers the run (weights, held-out examples) and writes the page; `explorer_records.py` reads the
records it embeds (curves, attention over training, ablation pictures, role cards); `page/` holds
the page's own files (HTML, CSS, the scripts that run the model), shipped with the package. It
uses the wings below it: measure, attention, interpret."""
