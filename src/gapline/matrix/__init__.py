"""gapline.matrix."""
