"""Dataset surgery: write a new v3.0 dataset from an ordered selection of source episodes.

``writer.write_dataset`` is the one writer (edit, split, merge, and later ``convert`` call it);
``select`` parses and chooses episodes; ``edit``, ``split`` and ``merge`` are the operations.
``repair`` brings back a recording killed before it finished (its own staging, the writer's
publish; the writer itself when episodes must be renumbered).
"""
