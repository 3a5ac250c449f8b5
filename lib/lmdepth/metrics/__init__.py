"""Pure fp32 metric functions and streamed statistics (no model access, no I/O)."""
