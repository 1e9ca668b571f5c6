"""Read-only questions about a fusion, asked by several stages: the memory order each tensor has
or inherits, how a tensor is sharded, whether an expr moves data between ranks, which logical axis
a stream loop iterates, which tensors can be segment boundaries, which IterDomains denote the same
iteration (the ID graph) and how slice, pad and cat move indices between producer and consumer."""
