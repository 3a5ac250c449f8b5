"""Models trained from scratch (MoEUT and a dense Transformer) and their training."""
