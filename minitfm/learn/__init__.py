"""`minitfm learn`: the book as exercises, graded, and training with a learner's own code.

`exercises.py` lists the book's functions a learner writes, in order; `workbook.py` writes a
workbook from the book and imports one, whose files `pinned.py` reads through its folder opened
once and `trust.py` judges (the user's own, written by no one else); `checks/` grades each
exercise against PyTorch and the book (`grading.py` runs them); `zoo.py` plants bugs in a copy
of the book; `code.py` is the config key `model.code`: which code a run runs (fast, book, or a
workbook).
"""
