"""gapline: message history that never pretends to be complete."""

__version__ = "0.1.0"
