"""Altair chart builders (from tidy tables only), the theme, and offline vega."""
