"""Segmentation: partition a preseg'd fusion into segments, each run by one executor."""
