"""Remote-ready nnsight traces: one per measurement, the same code here and on NDIF (see :mod:`.remote`)."""
