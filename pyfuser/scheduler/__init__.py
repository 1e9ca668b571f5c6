"""Schedulers and the utilities they share (input caches, reduction classification)."""
