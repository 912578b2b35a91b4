"""Building blocks of the packed forward passes: attention backends, norms, activations."""
