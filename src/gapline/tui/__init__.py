"""gapline.tui."""
