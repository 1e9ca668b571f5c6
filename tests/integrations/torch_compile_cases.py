"""One small program per ATen op the backend translates: the op between two pointwise ops, so the
partitioner puts it inside a region (a lone view would stay eager). Inputs are float64 where the op
is differentiable, so the same case runs ``gradcheck``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten


@dataclass(frozen=True)
class Case:
    op: Any
    fn: Callable[..., Any]
    inputs: Callable[[], list[torch.Tensor]]
    #: differentiable in its float inputs (gradcheck runs on them)
    grad: bool = True

    @property
    def id(self) -> str:
        return str(self.op).removeprefix("aten.")


def f(*shape: int, low: float = -2.0, high: float = 2.0) -> Callable[[], torch.Tensor]:
    return lambda: (torch.rand(*shape, dtype=torch.float64) * (high - low) + low).requires_grad_()


def i(*shape: int, high: int = 5) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, high, shape)


def b(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.rand(*shape) > 0.5


def inputs(*makers: Callable[[], torch.Tensor]) -> Callable[[], list[torch.Tensor]]:
    return lambda: [m() for m in makers]


def unary(op: Any, low: float = -2.0, high: float = 2.0, grad: bool = True) -> Case:
    return Case(op, lambda x: op(x * 1.5) + 1, inputs(f(3, 4, low=low, high=high)), grad)


def binary(op: Any, grad: bool = True) -> Case:
    return Case(op, lambda x, y: op(x * 2, y - 1) * 3, inputs(f(3, 4, low=0.5), f(4, low=0.5)), grad)


def scalar_binary(op: Any, value: Any = 0.75, grad: bool = True) -> Case:
    return Case(op, lambda x: op(x * 2, value) * 3, inputs(f(3, 4, low=0.5)), grad)


def compare(op: Any) -> Case:
    return Case(op, lambda x, y: aten.where.self(op(x * 2, y), x, y * 3), inputs(f(3, 4), f(4)))


def compare_scalar(op: Any) -> Case:
    return Case(op, lambda x: aten.where.self(op(x * 2, 0.5), x, x * 3), inputs(f(3, 4)))


def integer_binary(op: Any) -> Case:
    return Case(op, lambda x, y: op(x + 1, y * 2) + 1, inputs(i(3, 4, high=9), i(4, high=9)), grad=False)


def view(op: Any, fn: Callable[..., Any], *makers: Callable[[], torch.Tensor]) -> Case:
    return Case(op, fn, inputs(*makers))


CASES: list[Case] = [
    *(unary(op) for op in (aten.abs.default, aten.neg.default, aten.exp.default, aten.sin.default, aten.cos.default,
                           aten.tanh.default, aten.sigmoid.default, aten.relu.default, aten.silu.default, aten.erf.default,
                           aten.erfc.default, aten.exp2.default, aten.expm1.default, aten.atan.default, aten.sinh.default,
                           aten.cosh.default, aten.asinh.default)),
    *(unary(op, 0.2, 2.0) for op in (aten.log.default, aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default,
                                     aten.log2.default, aten.log10.default, aten.log1p.default, aten.lgamma.default)),
    unary(aten.acosh.default, 1.0, 2.0),
    *(unary(op, -0.6, 0.6) for op in (aten.asin.default, aten.acos.default, aten.atanh.default, aten.erfinv.default,
                                      aten.tan.default)),
    *(unary(op, grad=False) for op in (aten.ceil.default, aten.floor.default, aten.round.default, aten.trunc.default,
                                       aten.sign.default, aten.frac.default)),
    *(Case(op, lambda x, op=op: aten.where.self(op(x * 2), x, x + 1), inputs(f(3, 4)))
      for op in (aten.signbit.default, aten.isnan.default, aten.isinf.default)),
    Case(aten.logical_not.default, lambda x: aten.where.self(aten.logical_not.default(x > 0), x, x * 2), inputs(f(3, 4))),
    Case(aten.bitwise_not.default, lambda x: aten.bitwise_not.default(x + 1) * 2, inputs(i(3, 4)), grad=False),
    Case(aten.gelu.default, lambda x: aten.gelu.default(x * 2) + 1, inputs(f(3, 4))),
    Case(aten.gelu.default, lambda x: aten.gelu.default(x * 2, approximate="tanh") + 1, inputs(f(3, 4))),
    *(binary(op) for op in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.pow.Tensor_Tensor,
                            aten.maximum.default, aten.minimum.default, aten.atan2.default, aten.rsub.Tensor)),
    Case(aten.add.Tensor, lambda x, y: aten.add.Tensor(x * 2, y, alpha=3) * 3, inputs(f(3, 4), f(4))),
    Case(aten.sub.Tensor, lambda x, y: aten.sub.Tensor(x * 2, y, alpha=0.5) * 3, inputs(f(3, 4), f(4))),
    *(scalar_binary(op) for op in (aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
                                   aten.pow.Tensor_Scalar, aten.clamp_min.default, aten.clamp_max.default,
                                   aten.rsub.Scalar)),
    Case(aten.pow.Scalar, lambda x: aten.pow.Scalar(1.5, x * 2) * 3, inputs(f(3, 4))),
    Case(aten.div.Tensor_mode, lambda x, y: aten.div.Tensor_mode(x * 4, y, rounding_mode="trunc") + x,
         inputs(f(3, 4), f(4, low=0.5)), grad=False),
    Case(aten.div.Tensor_mode, lambda x, y: aten.div.Tensor_mode(x - 2, y + 1, rounding_mode="trunc") * 2,
         inputs(i(3, 4, high=20), i(4)), grad=False),
    Case(aten.div.Tensor_mode, lambda x, y: aten.div.Tensor_mode(x - 10, y - 2, rounding_mode="floor") * 2,
         inputs(i(3, 4, high=20), lambda: torch.tensor([-2, -1, 1, 3]) + 2), grad=False),
    Case(aten.floor_divide.default, lambda x: aten.floor_divide.default(x - 10, 3) * 2, inputs(i(3, 4, high=20)),
         grad=False),
    *(binary(op, grad=False) for op in (aten.fmod.Tensor, aten.remainder.Tensor)),
    *(scalar_binary(op, grad=False) for op in (aten.fmod.Scalar, aten.remainder.Scalar)),
    *(compare(op) for op in (aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor,
                             aten.ge.Tensor)),
    *(compare_scalar(op) for op in (aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar,
                                    aten.ge.Scalar)),
    *(Case(op, lambda x, y, op=op: aten.where.self(op(x > 0, y > 0), x, y * 3), inputs(f(3, 4), f(4)))
      for op in (aten.logical_and.default, aten.logical_or.default)),
    *(integer_binary(op) for op in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor)),
    *(Case(op, lambda x, op=op: op(x + 1, 6) * 2, inputs(i(3, 4, high=9)), grad=False)
      for op in (aten.bitwise_and.Scalar, aten.bitwise_or.Scalar, aten.bitwise_xor.Scalar)),
    Case(aten.clamp.default, lambda x: aten.clamp.default(x * 2, -1.0, 1.5) + 1, inputs(f(3, 4))),
    Case(aten.clamp.default, lambda x: aten.clamp.default(x * 2, min=-1.0) + 1, inputs(f(3, 4))),
    Case(aten.clamp.Tensor, lambda x, lo: aten.clamp.Tensor(x * 2, lo - 1, None) + 1, inputs(f(3, 4), f(4))),
    Case(aten.where.self, lambda c, x, y: aten.where.self(c, x * 2, y) + 1, inputs(b(3, 4), f(3, 4), f(4))),
    Case(aten.lerp.Scalar, lambda x, y: aten.lerp.Scalar(x * 2, y, 0.3) + 1, inputs(f(3, 4), f(4))),
    Case(aten.lerp.Tensor, lambda x, y, w: aten.lerp.Tensor(x * 2, y, w) + 1, inputs(f(3, 4), f(4), f(3, 4))),
    Case(aten.addcmul.default, lambda x, y, z: aten.addcmul.default(x * 2, y, z, value=0.5) + 1,
         inputs(f(3, 4), f(4), f(3, 4))),
    Case(aten.addcdiv.default, lambda x, y, z: aten.addcdiv.default(x * 2, y, z, value=0.5) + 1,
         inputs(f(3, 4), f(4), f(3, 4, low=0.5))),
    # --- shape ---------------------------------------------------------------------------------------
    view(aten.alias.default, lambda x: aten.alias.default(x * 2) + 1, f(3, 4)),
    Case(aten.detach.default, lambda x: aten.detach.default(x * 2) + x, inputs(f(3, 4)), grad=False),
    view(aten.clone.default, lambda x: aten.clone.default(x.t() * 2, memory_format=torch.contiguous_format) + 1,
         f(3, 4)),
    view(aten.view.default, lambda x: aten.view.default(x * 2, [2, 6]) + 1, f(3, 4)),
    view(aten._unsafe_view.default, lambda x: aten._unsafe_view.default(x * 2, [4, -1]) + 1, f(3, 4)),
    view(aten.expand.default, lambda x, y: aten.expand.default(y * 2, [2, 3, 4]) + x, f(3, 4), f(4)),
    Case(aten.repeat.default, lambda x: aten.repeat.default(x * 2, [2, 1, 3]) + 1, inputs(f(3, 1, 4))),
    Case(aten.repeat.default, lambda x: aten.repeat.default(x * 2, [2, 2, 1]) + 1, inputs(f(3, 4))),
    view(aten.permute.default, lambda x: aten.permute.default(x * 2, [2, 0, 1]) + 1, f(2, 3, 4)),
    view(aten.transpose.int, lambda x: aten.transpose.int(x * 2, 0, -1) + 1, f(2, 3, 4)),
    view(aten.t.default, lambda x: aten.t.default(x * 2) + 1, f(3, 4)),
    view(aten.unsqueeze.default, lambda x, y: aten.unsqueeze.default(y * 2, -1) + x, f(4, 3), f(4)),
    view(aten.squeeze.default, lambda x: aten.squeeze.default(x * 2) + 1, f(3, 1, 4)),
    view(aten.squeeze.dim, lambda x: aten.squeeze.dim(x * 2, 1) + 1, f(3, 1, 4)),
    view(aten.squeeze.dims, lambda x: aten.squeeze.dims(x * 2, [0, 1]) + 1, f(3, 1, 4)),
    view(aten.slice.Tensor, lambda x: aten.slice.Tensor(x * 2, 1, 1, 9223372036854775807, 2) + 1, f(3, 6)),
    view(aten.slice.Tensor, lambda x: aten.slice.Tensor(x * 2, 0, -2) + 1, f(5, 4)),
    view(aten.select.int, lambda x: aten.select.int(x * 2, 1, -1) + 1, f(3, 4)),
    view(aten.split.Tensor, lambda x: [t + 1 for t in aten.split.Tensor(x * 2, 2, 1)], f(3, 5)),
    view(aten.split_with_sizes.default, lambda x: [t * 3 for t in aten.split_with_sizes.default(x * 2, [1, 3], -1)],
         f(3, 4)),
    view(aten.unbind.int, lambda x: [t * 3 for t in aten.unbind.int(x * 2, 0)], f(3, 4)),
    Case(aten.cat.default, lambda x, y: aten.cat.default([x * 2, y], 1) + 1, inputs(f(3, 4), f(3, 2))),
    Case(aten.cat.default, lambda x: aten.cat.default([torch.empty(0, dtype=x.dtype, device=x.device), x * 2], 0) + 1,
         inputs(f(3, 4))),
    Case(aten.stack.default, lambda x, y: aten.stack.default([-y * 2, x], -1).flatten(-2) + 1, inputs(f(3, 4), f(3, 4))),
    Case(aten.stack.default, lambda x, y: aten.stack.default([x * 2, y.t()], 0) + 1, inputs(f(3, 4), f(4, 3))),
    Case(aten.roll.default, lambda x: aten.roll.default(x * 2, [1, -2], [1, 2]) + 1, inputs(f(2, 5, 7))),
    Case(aten.roll.default, lambda x: aten.roll.default(x * 2, [7, 3], [0, -1]) + 1, inputs(f(3, 4))),
    Case(aten.constant_pad_nd.default, lambda x: aten.constant_pad_nd.default(x * 2, [1, 2, 0, 1], 0.5) + 1,
         inputs(f(3, 4))),
    Case(aten.slice_backward.default, lambda g: aten.slice_backward.default(g * 2, [3, 7], 1, 2, 6, 1) + 1,
         inputs(f(3, 4))),
    Case(aten.select_backward.default, lambda g: aten.select_backward.default(g * 2, [3, 4], 0, -1) + 1,
         inputs(f(4))),
    Case(aten.slice_scatter.default, lambda x, y: aten.slice_scatter.default(x * 2, y + 1, 1, 2, 5) + 1,
         inputs(f(3, 7), f(3, 3))),
    Case(aten.slice_scatter.default, lambda x, y: aten.slice_scatter.default(x * 2, y.t() + 1, 0, -2) * 3,
         inputs(f(5, 4), f(4, 2))),
    Case(aten.select_scatter.default, lambda x, y: aten.select_scatter.default(x * 2, y + 1, 1, -1) + 1,
         inputs(f(3, 4, 2), f(3, 2))),
    # --- casts and creation -----------------------------------------------------------------------------
    Case(aten._to_copy.default, lambda x: aten._to_copy.default(x * 2, dtype=torch.float32) + 1, inputs(f(3, 4)),
         grad=False),
    Case(aten.copy.default, lambda x, y: aten.copy.default(x * 2, y + 1) * 3, inputs(f(3, 4), f(4)),
         grad=False),  # (no derivative in eager: the op appears in graphs AOTAutograd functionalized)
    Case(aten.copy.default, lambda x, y: aten.copy.default(x.float() * 2, y.t() + 1) * 3, inputs(f(3, 4), f(4, 3)),
         grad=False),
    Case(aten._to_copy.default, lambda x: aten._to_copy.default(x * 2, dtype=torch.int32) + 1, inputs(f(3, 4)),
         grad=False),
    Case(aten.full.default, lambda x: aten.full.default([3, 4], 2.5, dtype=torch.float64, device=x.device) * x, inputs(f(3, 4))),
    Case(aten.zeros.default, lambda x: aten.zeros.default([4], dtype=torch.float64, device=x.device) + x * 2, inputs(f(3, 4))),
    Case(aten.ones.default, lambda x: aten.ones.default([4], dtype=torch.float64, device=x.device) + x * 2, inputs(f(3, 4))),
    Case(aten.zeros_like.default, lambda x: aten.zeros_like.default(x) + x * 2, inputs(f(3, 4))),
    # (uninitialized values, every one written before it is read)
    Case(aten.empty_like.default, lambda x: aten.copy.default(aten.empty_like.default(x), x * 2) + 1, inputs(f(3, 4)),
         grad=False),
    Case(aten.new_empty.default, lambda x: aten.slice_scatter.default(aten.new_empty.default(x, [3, 4]), x * 2, 0)
         + 1, inputs(f(3, 4)), grad=False),
    Case(aten.new_empty_strided.default, lambda x: aten.slice_scatter.default(
        aten.new_empty_strided.default(x, [3, 4], [1, 3]), x * 2, 1) + 1, inputs(f(3, 4)), grad=False),
    Case(aten.fill.Tensor, lambda x, v: aten.fill.Tensor(x * 2, v.sum()) + x, inputs(f(3, 4), f(2))),
    Case(aten.tril.default, lambda x: aten.tril.default(x * 2, -1) + 1, inputs(f(2, 4, 5))),
    Case(aten.avg_pool2d.default, lambda x: aten.avg_pool2d.default(x * 2, [2, 1], [2, 1], 0, True) + 1,
         inputs(f(2, 1, 6, 5))),
    Case(aten.avg_pool2d.default, lambda x: aten.avg_pool2d.default(x.permute(0, 3, 1, 2) * 2, [3, 2]) + 1,
         inputs(f(2, 6, 4, 3))),
    Case(aten.avg_pool2d_backward.default, lambda g, x: aten.avg_pool2d_backward.default(
        g * 2, x, [2, 2], [2, 2], 0, False, True, None) + 1, inputs(f(2, 3, 2, 3), f(2, 3, 4, 6))),
    Case(aten.triu.default, lambda x: aten.triu.default(x * 2, 2) + 1, inputs(f(5, 3))),
    Case(aten.ones_like.default, lambda x: aten.ones_like.default(x) + x * 2, inputs(f(3, 4))),
    Case(aten.full_like.default, lambda x: aten.full_like.default(x, 7.0) + x * 2, inputs(f(3, 4))),
    Case(aten.new_zeros.default, lambda x: aten.new_zeros.default(x, [4]) + x * 2, inputs(f(3, 4))),
    Case(aten.new_ones.default, lambda x: aten.new_ones.default(x, [4]) + x * 2, inputs(f(3, 4))),
    Case(aten.new_full.default, lambda x: aten.new_full.default(x, [4], -3.0) + x * 2, inputs(f(3, 4))),
    Case(aten.scalar_tensor.default, lambda x: aten.scalar_tensor.default(1.5, dtype=torch.float64, device=x.device) * x + 1,
         inputs(f(3, 4))),
    Case(aten.arange.default, lambda x: aten.arange.default(4, dtype=torch.float64, device=x.device) * x + 1, inputs(f(3, 4))),
    Case(aten.arange.start, lambda x: aten.arange.start(2, 6, device=x.device) * x + 1, inputs(f(3, 4))),
    Case(aten.arange.start_step, lambda x: aten.arange.start_step(1.0, 3.0, 0.5, dtype=torch.float64, device=x.device) * x + 1,
         inputs(f(3, 4))),
    # --- reductions ------------------------------------------------------------------------------------
    Case(aten.sum.dim_IntList, lambda x: aten.sum.dim_IntList(x * 2, [0, 2], True) + 1, inputs(f(2, 3, 4))),
    Case(aten.sum.dim_IntList, lambda x: aten.sum.dim_IntList(x * 2, [1], dtype=torch.float32) + 1,
         inputs(f(3, 4)), grad=False),
    Case(aten.sum.default, lambda x: aten.sum.default(x * 2) + x, inputs(f(3, 4))),
    Case(aten.mean.dim, lambda x: aten.mean.dim(x * 2, [-1], True) + x, inputs(f(3, 4))),
    Case(aten.mean.default, lambda x: aten.mean.default(x * 2) + x, inputs(f(3, 4))),
    Case(aten.prod.dim_int, lambda x: aten.prod.dim_int(x * 2, 1) + 1, inputs(f(3, 4, low=0.5))),
    Case(aten.prod.default, lambda x: aten.prod.default(x * 2) + x, inputs(f(3, 4, low=0.5))),
    Case(aten.amax.default, lambda x: aten.amax.default(x * 2, [1], True) + x, inputs(f(3, 4))),
    Case(aten.amin.default, lambda x: aten.amin.default(x * 2, [0]) + x, inputs(f(3, 4))),
    Case(aten.max.default, lambda x: aten.max.default(x * 2) + x, inputs(f(3, 4))),
    Case(aten.min.default, lambda x: aten.min.default(x * 2) + x, inputs(f(3, 4))),
    Case(aten.all.dim, lambda x: aten.where.self(aten.all.dim(x > -1, -1, True), x, x * 2), inputs(f(3, 4)),
         grad=False),
    Case(aten.all.dims, lambda x: aten.all.dims(x * 2 > -3, [0, 2]), inputs(f(2, 3, 4)), grad=False),
    Case(aten.all.default, lambda x: aten.all.default(aten.remainder.Scalar(x, 3) + x), inputs(i(3, 4)),
         grad=False),
    Case(aten.any.dim, lambda x: aten.any.dim(x, 1) | (x[:, 0] > 2), inputs(i(3, 4)), grad=False),
    Case(aten.any.dims, lambda x: aten.any.dims(aten.logical_not.default(x), [1], True) & x, inputs(b(3, 4)),
         grad=False),
    Case(aten.any.default, lambda x: aten.any.default(x * 2 > 3.5) | (x > 1), inputs(f(3, 4)), grad=False),
    Case(aten.all.dim, lambda x: aten.all.dim(x * 2 > 0, 1) | (x.sum(1) > 0), inputs(f(3, 0)), grad=False),
    Case(aten.any.dims, lambda x: aten.any.dims(x * 2 > 0, [0, 1]) | (x.sum(1) > 0), inputs(f(3, 0, 2)),
         grad=False),
    Case(aten.var.correction, lambda x: aten.var.correction(x * 2, [1], correction=0, keepdim=True) + x,
         inputs(f(3, 4))),
    Case(aten.var_mean.correction, lambda x: [t + 1 for t in aten.var_mean.correction(x * 2, [0])], inputs(f(3, 4))),
    Case(aten.argmax.default, lambda x: aten.argmax.default(x * 2, 1) + 1, inputs(f(3, 4)), grad=False),
    Case(aten.argmin.default, lambda x: aten.argmin.default(x * 2, 0, True) + 1, inputs(f(3, 4)), grad=False),
    Case(aten.cumsum.default, lambda x: aten.cumsum.default(x * 2, 1) + 1, inputs(f(3, 4))),
    Case(aten.cumsum.default, lambda x: aten.cumsum.default(x * 2.5, 0, dtype=torch.int32) + 1, inputs(f(5, 3)),
         grad=False),
    # --- contractions and indexing ------------------------------------------------------------------------
    Case(aten.mm.default, lambda x, w: aten.mm.default(x * 2, w) + 1, inputs(f(3, 4), f(4, 5))),
    Case(aten.mm.default, lambda x, w: aten.mm.default(x * 2, w.t()) + 1, inputs(f(3, 4), f(5, 4))),
    Case(aten.bmm.default, lambda x, w: aten.bmm.default(x * 2, w) + 1, inputs(f(2, 3, 4), f(2, 4, 5))),
    Case(aten.baddbmm.default, lambda b, x, w: aten.baddbmm.default(b * 2, x, w, beta=0.5, alpha=0.25) + 1,
         inputs(f(2, 1, 5), f(2, 3, 4), f(2, 4, 5))),
    Case(aten.baddbmm.default, lambda b, x, w: aten.baddbmm.default(b, x, w, beta=0) + 1,
         inputs(f(2, 3, 5), f(2, 3, 4), f(2, 4, 5))),
    Case(aten.addmm.default, lambda bias, x, w: aten.addmm.default(bias, x * 2, w.t()) + 1,
         inputs(f(5), f(3, 4), f(5, 4))),
    Case(aten.addmm.default, lambda bias, x, w: aten.addmm.default(bias, x * 2, w, beta=0.5, alpha=2) + 1,
         inputs(f(3, 5), f(3, 4), f(4, 5))),
    Case(aten.embedding.default, lambda w, idx: aten.embedding.default(w * 2, idx) + 1, inputs(f(6, 4), i(3, 2, high=6))),
    Case(aten.index_select.default, lambda x, idx: aten.index_select.default(x * 2, 1, idx) + 1,
         inputs(f(3, 4), i(5, high=4))),
    Case(aten.embedding_dense_backward.default,
         lambda g, idx: aten.embedding_dense_backward.default(g * 2, idx, 7, 2, False) + 1,
         inputs(f(3, 5, 4), i(3, 5, high=7)), grad=False),
    Case(aten.gather.default, lambda x, idx: aten.gather.default(x * 2, 1, idx) + 1, inputs(f(3, 4), i(3, 2, high=4))),
    Case(aten.index.Tensor, lambda x, rows, cols: aten.index.Tensor(x * 2, [None, rows - 2, cols]) + 1,
         inputs(f(3, 4, 5), i(2, 1, high=4), i(3, high=5))),
    Case(aten.index_put.default, lambda x, idx, v: aten.index_put.default(x * 2, [idx - 2], v * 3, True) + 1,
         inputs(f(5, 3), i(7, high=5), f(7, 3))),
    Case(aten._unsafe_index.Tensor, lambda x, rows: aten._unsafe_index.Tensor(x * 2, [rows, None]) + 1,
         inputs(f(4, 5), i(3, 2, high=4))),
    Case(aten._unsafe_index_put.default,
         lambda x, idx, v: aten._unsafe_index_put.default(x * 2, [idx], v * 3, True) + 1,
         inputs(f(5, 3), i(7, high=5), f(7, 3))),
    Case(aten.scatter.src, lambda x, idx, v: aten.scatter.src(x * 2, 1, idx, v * 3) + 1,
         inputs(f(3, 5), lambda: torch.rand(3, 5).argsort(1)[:, :2], f(3, 2))),
    Case(aten.scatter.value, lambda x, idx: aten.scatter.value(x * 2, 0, idx, 1.5) + 1,
         inputs(f(4, 3), lambda: torch.rand(4, 3).argsort(0)[:2])),
    Case(aten.triu.default, lambda x: aten.triu.default(x * 2, 1) + 1, inputs(f(4, 4))),
]
