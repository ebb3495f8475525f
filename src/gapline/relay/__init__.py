"""gapline.relay."""
