"""envspec: reproducible GPU deep-learning environments (spec -> lock -> build -> verify)."""

__version__ = "0.1.0"
