"""Pre-segmentation passes: rewrite the fusion before it is split into segments."""
