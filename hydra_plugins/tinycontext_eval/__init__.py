"""TinyContext evaluation plugins for Hydra (see reusing_sweeper)."""
