"""Bridges to the rest of the PyTorch stack: DTensor inputs (``dtensor.py``)."""
