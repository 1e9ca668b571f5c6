"""Random tensors of ``fd.ops``: uniform, normal, rand_like and randn_like (nvFuser's arguments),
reproducible given ``rng_seed`` / ``rng_offset`` (see ``ir/ops/random.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pyfuser.frontend.ops_base import Operand, OpsBase, SizeLike
from pyfuser.ir.base import Val
from pyfuser.ir.dtypes import DataType, as_data_type
from pyfuser.ir.iter_domain import IterType
from pyfuser.ir.ops.random import RandomOp, RandomOpType
from pyfuser.ir.symbolic import SymExpr
from pyfuser.ir.tensor_view import TensorView


class RandomOps(OpsBase):
    def _random(self, kind: RandomOpType, a: Operand, b: Operand, shape: Sequence[SizeLike],
                rng_seed: Operand | None, rng_offset: Operand | None, dtype: DataType | torch.dtype) -> TensorView:
        op = kind.name
        dt = as_data_type(dtype)
        if not dt.is_floating:
            raise TypeError(f"{op}: dtype must be a floating-point type, got {dt}")
        params: list[Val] = []
        for what, x in (("first parameter", a), ("second parameter", b)):
            val = self._val(x, f"{op} {what}")
            if isinstance(val, TensorView) or not (val.dtype.is_floating or val.dtype.is_integral):
                raise TypeError(f"{op}: the {what} must be a real number or scalar, got {val}")
            params.append(val)
        if (rng_seed is None) != (rng_offset is None):
            raise ValueError(f"{op}: rng_seed and rng_offset go together (got only "
                             f"{'rng_seed' if rng_offset is None else 'rng_offset'})")
        seeds: list[Val] = []
        for what, given in (("rng_seed", rng_seed), ("rng_offset", rng_offset)):
            if given is None:
                continue
            val = self._val(given, f"{op} {what}")
            if isinstance(val, TensorView) or not val.dtype.is_integral:
                raise TypeError(f"{op}: {what} must be an int or an integer scalar, got {val}")
            seeds.append(val)
        return self._random_tensor(kind, params, self._shape(shape, f"{op} shape"), seeds, dt)

    def _random_tensor(self, kind: RandomOpType, params: list[Val], extents: list[SymExpr], seeds: list[Val],
                       dtype: DataType) -> TensorView:
        ids = [self._id(1, IterType.Broadcast) if e.value == 1 else self._id(e) for e in extents]
        out = self._new_tv(ids, dtype)
        RandomOp(self._fusion, kind, out, params[0], params[1], extents, *(seeds or (None, None)))
        return out

    def uniform(self, minval: Operand, maxval: Operand, shape: Sequence[SizeLike], *, rng_seed: Operand | None = None,
                rng_offset: Operand | None = None, dtype: DataType | torch.dtype = DataType.Float) -> TensorView:
        """Values drawn uniformly from ``[minval, maxval)``."""
        return self._random(RandomOpType.uniform, minval, maxval, shape, rng_seed, rng_offset, dtype)

    def normal(self, mean: Operand, std: Operand, shape: Sequence[SizeLike], *, rng_seed: Operand | None = None,
               rng_offset: Operand | None = None, dtype: DataType | torch.dtype = DataType.Float) -> TensorView:
        """Values drawn from a normal distribution of ``mean`` and ``std``."""
        return self._random(RandomOpType.normal, mean, std, shape, rng_seed, rng_offset, dtype)

    def _like(self, kind: RandomOpType, x: TensorView) -> TensorView:
        tv = self._tv(x, f"{kind.name}_like")
        if not tv.dtype.is_floating:
            raise TypeError(f"{'rand' if kind is RandomOpType.uniform else 'randn'}_like: {tv.short_name} has dtype "
                            f"{tv.dtype}; expected a floating-point tensor")
        extents = [i.extent for i in tv.get_logical_domain(no_reductions=True)]
        return self._random_tensor(kind, [self._val(0.0, "a"), self._val(1.0, "b")], extents, [], tv.dtype)

    def rand_like(self, x: TensorView) -> TensorView:
        """Uniform ``[0, 1)`` values of ``x``'s shape and dtype."""
        return self._like(RandomOpType.uniform, x)

    def randn_like(self, x: TensorView) -> TensorView:
        """Standard normal values of ``x``'s shape and dtype."""
        return self._like(RandomOpType.normal, x)
