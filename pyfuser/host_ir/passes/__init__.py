"""Host IR passes, one per module; the ordered list in ``pipeline.py``."""
