"""Model access: architecture families and adapters, loading and the converted-model cache."""
