"""Host IR: the program each rank runs (allocations, segment launches, stream loops) and its evaluator."""
