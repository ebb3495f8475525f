"""gapline.history."""
