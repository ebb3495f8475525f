"""gapline.journal."""
