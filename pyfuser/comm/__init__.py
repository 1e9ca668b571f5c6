"""The communication layer: the process-wide communicator, the collectives a resharding ``set``
becomes, their Host IR nodes and lowering, and cutting global tensors into shards."""
