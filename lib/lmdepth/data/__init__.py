"""Data: named data sets, user files, difficulty ladders, synthetic generators, DM math, alignment."""
