"""Code generation: a scheduled segment becomes one Triton kernel.

The schedule is the program: the reference tensor's loop domain is the kernel's loop nest
(``grid_*`` IDs are program ids, ``block_*`` / ``vectorize`` / ``unroll`` IDs are axes of the
tile, ``serial`` IDs are loops), and every tensor is indexed by walking its split / merge
transforms back from the loop indices to its logical domain, then to its strides.
"""
