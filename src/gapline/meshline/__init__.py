"""gapline.meshline."""
