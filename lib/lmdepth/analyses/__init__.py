"""One module per chapter: the cached run and the summaries its claims read."""
