"""Read-only questions about a fusion, asked by several stages: the memory order each tensor has
or inherits, how a tensor is sharded, whether an expr moves data between ranks, which logical axis
a stream loop iterates, and which tensors can be segment boundaries."""
