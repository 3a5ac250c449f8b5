"""Hooks and interventions on the residual stream: capture, layer skipping, partial forward passes."""
