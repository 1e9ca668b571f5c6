"""Small scheduling utilities shared by the schedulers."""

from __future__ import annotations

from pyfuser.ir.tensor_view import TensorView


def set_compute_at(tv: TensorView, position: int) -> TensorView:
    """Record that ``tv``'s loop IDs left of ``position`` are shared with its consumer's loop nest."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"{tv.short_name}: compute-at position must be an int, got {type(position).__name__}")
    n = len(tv.get_loop_domain())
    if not 0 <= position <= n:
        raise ValueError(f"{tv.short_name}: compute-at position {position} is out of range for a loop domain of "
                         f"{n} IDs (valid: 0..{n})")
    tv.compute_at_pos = position
    tv.fusion.mark_changed()
    return tv
