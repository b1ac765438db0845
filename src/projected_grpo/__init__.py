"""projected_grpo: GRPO with reward-hack gradients erased or routed in an SVD-adapter basis (see README)."""
