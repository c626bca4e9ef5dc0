"""Dataset surgery: write a new v3.0 dataset from an ordered selection of source episodes.

``writer.write_dataset`` is the one writer (edit, split, merge, and later ``convert`` call it);
``select`` parses and chooses episodes; ``edit``, ``split`` and ``merge`` are the operations.
"""
