"""Allocation-order inference (seed 001): outputs without a requirement get their inputs' layout as
a hint, with a careful choice of reference; the executor produces the hinted layout."""

from __future__ import annotations

import copy

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.ir.analysis.allocation_order import infer_allocation_orders
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.tensor_view import TensorView
from pyfuser.options import CompileOptions
from pyfuser.preseg.allocation_order_inference import infer_allocation_order
from pyfuser.preseg.pipeline import run_preseg_passes

CL = torch.channels_last


def preseg(fusion: Fusion, **options: object) -> Fusion:
    copied = copy.deepcopy(fusion)
    run_preseg_passes(copied, CompileOptions(**options))  # type: ignore[arg-type]
    return copied


def out_dims_order(tv: TensorView) -> list[int]:
    """Logical positions (reductions dropped) of ``tv``'s allocation domain, outermost first."""
    kept = tv.get_logical_domain(no_reductions=True)
    return [next(k for k, j in enumerate(kept) if j is i) for i in tv.get_allocation_domain() if not i.is_reduction()]


def cl_input(fd: FusionDefinition) -> TensorView:
    return fd.define_tensor([-1, -1, -1, -1], contiguity=True, stride_order=[3, 0, 2, 1])


# --- seed 001: linear / matmul ----------------------------------------------------------------------
def test_linear_with_plain_inputs_gives_a_plain_output() -> None:
    """``[b, m, k] x [n, k] -> [b, m, n]``: the naive highest-rank reference would give ``[n, b, m]``."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], contiguity=True)
        w = fd.define_tensor([-1, -1], contiguity=True)
        bias = fd.define_tensor([-1], contiguity=True)
        fd.add_output(fd.ops.linear(x, w, bias))
    out = preseg(fd.fusion).outputs()[0]
    assert out_dims_order(out) == [0, 1, 2]
    xs, ws, bs = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    (res,) = fd.execute([xs, ws, bs])
    torch.testing.assert_close(res, torch.nn.functional.linear(xs, ws, bs))
    assert res.stride() == (15, 5, 1)


def test_linear_keeps_the_batch_order_of_x_and_n_innermost() -> None:
    """x laid out ``[m, b, k]``: batch IDs follow x, N stays innermost; a transposed weight changes nothing."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], contiguity=True, stride_order=[1, 2, 0])
        w = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.linear(x, w))
    assert out_dims_order(preseg(fd.fusion).outputs()[0]) == [1, 0, 2]
    xs = torch.randn(3, 2, 4).transpose(0, 1)
    ws = torch.randn(4, 5).t()
    (res,) = fd.execute([xs, ws])
    torch.testing.assert_close(res, torch.nn.functional.linear(xs, ws))
    assert res.stride() == (5, 10, 1)


def test_matmul_keeps_m_n_in_gemm_order() -> None:
    """A column-major ``a`` does not make the output column-major; batch IDs still follow ``a``."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], contiguity=True, stride_order=[2, 0, 1])  # [b, m, k], m innermost
        b = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(fd.ops.matmul(a, b))
    assert out_dims_order(preseg(fd.fusion).outputs()[0]) == [0, 1, 2]
    a_s = torch.randn(2, 4, 3).transpose(1, 2)
    b_s = torch.randn(4, 5)
    (res,) = fd.execute([a_s, b_s])
    torch.testing.assert_close(res, a_s @ b_s)
    assert res.is_contiguous()


# --- channels-last through pointwise ops and reductions ----------------------------------------------
def test_channels_last_through_pointwise_ops() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    bias = torch.randn(3, 1, 1)
    with FusionDefinition() as fd:
        t0 = cl_input(fd)
        t1 = fd.define_tensor([-1, 1, 1], contiguity=True)
        t2 = fd.ops.add(fd.ops.relu(t0), t1)          # broadcast bias: x is the reference
        t3 = fd.ops.cast(t2, torch.float64)
        t4 = fd.ops.set(t3)
        fd.add_output(t4)
    (res,) = fd.execute([x, bias])
    torch.testing.assert_close(res, (torch.relu(x) + bias).double())
    assert res.stride() == torch.empty(2, 3, 4, 5).to(memory_format=CL).stride()


def test_channels_last_through_reductions() -> None:
    """Reductions keep the input's order on the IDs they keep (torch would return contiguous)."""
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    with FusionDefinition() as fd:
        t0 = cl_input(fd)
        fd.add_output(fd.ops.sum(t0, [2]))                      # [N, C, W] -> C innermost
        fd.add_output(fd.ops.max(t0, [1]))                      # [N, H, W] plain
        fd.add_output(fd.ops.mean(t0, [2, 3], keepdim=True))    # [N, C, 1, 1]
    over_h, over_c, pooled = fd.execute([x])
    torch.testing.assert_close(over_h, x.sum(2))
    torch.testing.assert_close(over_c, x.amax(1))
    torch.testing.assert_close(pooled, x.mean((2, 3), keepdim=True))
    assert over_h.stride() == (15, 1, 3)
    assert over_c.is_contiguous()
    assert pooled.stride()[:2] == (3, 1)


def test_squeeze_broadcast_and_permute_carry_the_order() -> None:
    x = torch.randn(4, 1, 6).permute(1, 2, 0)  # [1, 6, 4], axis 2 outermost
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([1, -1, -1], contiguity=[True, None, True], stride_order=[1, 0, 2])  # allocation order
        t1 = fd.ops.squeeze(t0, [0])                       # [6, 4] column-major
        t2 = fd.ops.broadcast(t1, [False, True, False])    # [6, 1, 4]
        t3 = fd.ops.permute(t1, [1, 0])                    # [4, 6] row-major in memory
        fd.add_output(fd.ops.exp(t1))
        fd.add_output(fd.ops.exp(t2))
        fd.add_output(fd.ops.exp(t3))
    a, b, c = fd.execute([x])
    torch.testing.assert_close(a, x.squeeze(0).exp())
    torch.testing.assert_close(b, x.squeeze(0).unsqueeze(1).exp())
    torch.testing.assert_close(c, x.squeeze(0).t().exp())
    assert a.stride() == (1, 6)
    assert b.stride()[0] == 1 and b.stride()[2] == 6
    assert c.stride() == (6, 1)


def test_first_operand_decides_as_in_torch() -> None:
    cl = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    plain = torch.randn(2, 3, 4, 5)
    with FusionDefinition() as fd:
        t_cl = cl_input(fd)
        t_plain = fd.define_tensor([-1, -1, -1, -1], contiguity=True)
        fd.add_output(fd.ops.add(t_cl, t_plain))
        fd.add_output(fd.ops.add(t_plain, t_cl))
    first_cl, first_plain = fd.execute([cl, plain])
    assert first_cl.stride() == (cl + plain).stride()
    assert first_plain.stride() == (plain + cl).stride()
    torch.testing.assert_close(first_cl, cl + plain)


def test_concrete_input_layout_without_a_declared_stride_order() -> None:
    """An input declared without a layout but executed channels-last: the program compiled for
    that layout knows it (CompileOptions.input_orders) and hints it to the output."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1, -1])
        fd.add_output(fd.ops.sigmoid(t0))
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    (res,) = fd.execute([x])
    assert res.stride() == x.stride()
    torch.testing.assert_close(res, torch.sigmoid(x))
    compiled = preseg(fd.fusion, input_orders=((0, 2, 3, 1),))
    assert compiled.inputs()[0].allocation_is_required
    assert out_dims_order(compiled.outputs()[0]) == [0, 2, 3, 1]


# --- hints: marked, printed, replaceable, switchable ----------------------------------------------
def test_inferred_layout_is_a_printed_hint_and_a_later_stage_may_replace_it() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    fusion = copy.deepcopy(fd.fusion)
    infer_allocation_order(fusion, CompileOptions())
    out = fusion.outputs()[0]
    assert out.has_allocation_domain() and not out.allocation_is_required
    assert "allocation domain : (iS3{i1}, iS2{i0}) (hint)" in out.transforms_string()
    out.set_allocation_domain(out.get_logical_domain(), hint=True)  # e.g. a scheduler's better choice
    assert out_dims_order(out) == [0, 1]
    inp = fusion.inputs()[0]
    with pytest.raises(ValueError, match=r"T0: allocation domain .* is a user requirement"):
        inp.set_allocation_domain(inp.get_logical_domain(), hint=True)


def test_disable_infer_contiguity() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(cl_input(fd)))
    (off,) = fd.execute([x], _disable_options=["infer_contiguity"])
    (on,) = fd.execute([x])
    assert off.is_contiguous() and on.stride() == x.stride()
    torch.testing.assert_close(off, on)
    assert not preseg(fd.fusion, disabled=frozenset({"infer_contiguity"})).outputs()[0].allocation_is_required


def test_orders_of_intermediates_are_inferred_without_touching_them() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        t1 = fd.ops.exp(t0)
        t2 = fd.ops.sum(t1, [1])
        fd.add_output(t2)
    orders = infer_allocation_orders(fd.fusion)
    l1 = t1.get_logical_domain()
    assert orders[id(t1)] == [l1[1], l1[0]]
    assert not t1.has_allocation_domain()


def test_bad_compile_time_input_layouts() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.exp(t0))
    with pytest.raises(ValueError, match=r"compile options carry 2 input layouts for a fusion of 1 inputs"):
        preseg(fd.fusion, input_orders=((0, 1), (0, 1)))
    with pytest.raises(ValueError, match=r"T0: input layout \[0, 0\] is not a permutation of its 2 axes"):
        preseg(fd.fusion, input_orders=((0, 0),))
