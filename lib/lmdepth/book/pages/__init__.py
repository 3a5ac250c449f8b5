"""What each chapter says about its results: computed prose (Markdown), display tables and the claim checks,
built from the analyses' tables and sidecars. One module per chapter; nothing here computes a model."""
