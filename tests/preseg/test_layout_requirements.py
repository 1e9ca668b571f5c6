"""Layout requirements (seed 001): define_tensor / add_output stride orders and user allocation
domains are met exactly; a requirement is never replaced by a hint; bad layouts fail clearly."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfuser import FusionDefinition
from pyfuser.ir.fusion import Fusion
from pyfuser.ir.layout import allocation_permutation, dense_strides
from pyfuser.options import CompileOptions
from pyfuser.preseg.pipeline import run_preseg_passes

SHAPES = {2: (5, 3), 3: (4, 3, 5), 4: (2, 3, 4, 5), 5: (2, 3, 1, 4, 3)}


def strided_like(shape: tuple[int, ...], stride_order: list[int]) -> torch.Tensor:
    """A random tensor of ``shape`` laid out densely in ``stride_order``."""
    perm = allocation_permutation(stride_order)
    base = torch.randn([shape[d] for d in perm])
    return base.permute([perm.index(d) for d in range(len(shape))])


def preseg(fusion: Fusion, **options: object) -> Fusion:
    copied = copy.deepcopy(fusion)
    run_preseg_passes(copied, CompileOptions(**options))  # type: ignore[arg-type]
    return copied


@settings(max_examples=30, deadline=None)
@given(rank=st.sampled_from([2, 3, 4, 5]), data=st.data())
def test_output_stride_order_is_met_exactly(rank: int, data: st.DataObject) -> None:
    shape = SHAPES[rank]
    in_order = data.draw(st.permutations(range(rank)), label="input stride order")
    out_order = data.draw(st.permutations(range(rank)), label="output stride order")
    x = strided_like(shape, list(in_order))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1] * rank, contiguity=True, stride_order=list(in_order))
        t1 = fd.ops.mul(fd.ops.exp(t0), 2.0)
        fd.add_output(t1, stride_order=list(out_order))
        fd.add_output(fd.ops.neg(t0))
    required, free = fd.execute([x])
    torch.testing.assert_close(required, torch.exp(x) * 2.0)
    torch.testing.assert_close(free, -x)
    assert required.stride() == tuple(dense_strides(shape, allocation_permutation(list(out_order)))), \
        "a requirement is met stride for stride, size-1 axes included"
    # no requirement: the input's order, as a hint (a size-1 axis's stride addresses nothing)
    hinted = dense_strides(shape, allocation_permutation(list(in_order)))
    assert [s for s, n in zip(free.stride(), shape, strict=True) if n > 1] == \
        [s for s, n in zip(hinted, shape, strict=True) if n > 1]


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_user_allocation_domain_on_output_is_a_requirement(rank: int) -> None:
    shape = SHAPES[rank]
    x = torch.randn(shape)
    perm = list(reversed(range(rank)))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1] * rank, contiguity=True)
        t1 = fd.ops.sigmoid(t0)
        fd.add_output(t1)
    ids = t1.get_logical_domain()
    t1.set_allocation_domain([ids[d] for d in perm])
    assert t1.allocation_is_required
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.sigmoid(x))
    assert out.stride() == tuple(dense_strides(shape, perm))


def test_required_output_stride_order_is_written_into_the_allocation_domain() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1])
        t1 = fd.ops.sum(t0, [1])
        fd.add_output(t1, stride_order=[0, 1])
    assert fd.fusion.get_output_stride_order(t1) == [0, 1]
    after = preseg(fd.fusion)
    out = after.outputs()[0]
    assert out.allocation_is_required
    kept = out.get_logical_domain(no_reductions=True)
    assert [i for i in out.get_allocation_domain() if not i.is_reduction()] == [kept[1], kept[0]]
    assert fd.fusion.outputs()[0].has_allocation_domain() is False, "the user's definition is untouched"
    (res,) = fd.execute([torch.randn(3, 4, 5)])
    assert res.stride() == (1, 3)


def test_stride_order_on_a_passthrough_output_copies_the_input() -> None:
    x = torch.randn(3, 4)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True)
        fd.add_output(t0, stride_order=[0, 1])
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x)
    assert out.stride() == (1, 3) and out.data_ptr() != x.data_ptr()


def test_programs_are_keyed_by_input_layout() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1, -1])
        fd.add_output(fd.ops.relu(t0))
    cache = fd.fec
    plain = torch.randn(2, 3, 4, 5)
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    (a,) = fd.execute([plain])
    assert cache.compile_count == 1 and a.is_contiguous()
    (b,) = fd.execute([cl])
    assert cache.compile_count == 2, "a new input layout compiles a new program"
    assert b.stride() == cl.stride()
    (c,) = fd.execute([torch.randn(3, 2, 5, 7)])
    assert cache.compile_count == 2, "new sizes of a known layout reuse its program"
    assert c.is_contiguous()
    cl_other = torch.randn(4, 5, 2, 3).to(memory_format=torch.channels_last)
    (d,) = fd.execute([cl_other])
    assert cache.compile_count == 2 and d.stride() == cl_other.stride()
    # with a size-1 channel axis, channels-last and plain strides describe the same memory order
    (e,) = fd.execute([torch.randn(2, 1, 4, 5).to(memory_format=torch.channels_last)])
    (f,) = fd.execute([torch.randn(2, 1, 4, 5)])
    assert cache.compile_count == 3, "size-1 axes are part of the key, their strides are not"
    assert e.is_contiguous() and f.is_contiguous()
    for out, inp in ((a, plain), (b, cl), (d, cl_other)):
        torch.testing.assert_close(out, torch.relu(inp))


# --- a requirement is never replaced by a hint ----------------------------------------------------
def test_hint_cannot_replace_a_required_allocation_domain() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(t0))
    ids = t0.get_logical_domain()
    with pytest.raises(ValueError, match=r"T0: allocation domain \(iS1\{i1\}, iS0\{i0\}\) is a user requirement"):
        t0.set_allocation_domain(ids, hint=True)
    assert t0.get_allocation_domain() == [ids[1], ids[0]]


def test_hint_cannot_replace_a_required_output_stride_order() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1, stride_order=[0, 1])
    with pytest.raises(ValueError, match=r"T1: output stride order \[0, 1\] is a user requirement"):
        t1.set_allocation_domain(t1.get_logical_domain(), hint=True)


def test_contradicting_requirements_fail_at_compile() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1, stride_order=[0, 1])
    t1.set_allocation_domain(t1.get_logical_domain())  # row-major, but the map asks column-major
    with pytest.raises(ValueError, match=r"T1: required output stride order \[0, 1\] contradicts its required "
                                         r"allocation domain"):
        fd.execute([torch.randn(2, 3)])


# --- bad layouts ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("stride_order", "pattern"), [
    ([0, 0, 1], r"define_tensor T0: stride_order \[0, 0, 1\] is not a permutation of 0..2"),
    ([0, 1, 3], r"define_tensor T0: stride_order \[0, 1, 3\] is not a permutation of 0..2"),
    ([0, 1], r"define_tensor T0: stride_order \[0, 1\] has 2 entries but the tensor has rank 3"),
])
def test_bad_input_stride_order(stride_order: list[int], pattern: str) -> None:
    with FusionDefinition() as fd, pytest.raises(ValueError, match=pattern):
        fd.define_tensor([-1, -1, -1], stride_order=stride_order)


@pytest.mark.parametrize(("stride_order", "pattern"), [
    ([1, 1], r"add_output T1: stride_order \[1, 1\] is not a permutation of 0..1"),
    ([2, 1, 0], r"add_output T1: stride_order \[2, 1, 0\] has 3 entries but the tensor has rank 2"),
])
def test_bad_output_stride_order(stride_order: list[int], pattern: str) -> None:
    with FusionDefinition() as fd:
        t1 = fd.ops.exp(fd.define_tensor([-1, -1]))
        with pytest.raises(ValueError, match=pattern):
            fd.add_output(t1, stride_order=stride_order)
    assert fd.fusion.outputs() == [], "a rejected output is not added"


def test_bad_contiguity_length() -> None:
    with FusionDefinition() as fd:
        with pytest.raises(ValueError, match=r"define_tensor T0: contiguity \[True\] has 1 entries but shape "
                                             r"\[-1, -1\] has rank 2"):
            fd.define_tensor([-1, -1], contiguity=[True], stride_order=[0, 1])
        t0 = fd.define_tensor([-1, -1])
    with pytest.raises(ValueError, match=r"T0: contiguity \[True, True, False\] has 3 entries but the allocation "
                                         r"domain has 2 non-reduction IDs"):
        t0.set_allocation_domain(t0.get_logical_domain(), [True, True, False])


def test_allocation_domain_must_cover_logical() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1])
        t1 = fd.ops.exp(t0)
        fd.add_output(t1)
    ids = t1.get_logical_domain()
    with pytest.raises(ValueError, match=r"T1 allocation domain does not cover logical IDs iS5\{i2\}"):
        t1.set_allocation_domain([ids[1], ids[0]])
    t1.split(2, 4)
    outer = t1.get_loop_domain()[2]
    with pytest.raises(ValueError, match=r"T1 allocation domain .*split/merge partners are missing"):
        t1.set_allocation_domain([ids[0], ids[1], outer])
    with pytest.raises(ValueError, match=r"T1 allocation domain lists iS3\{i0\} twice"):
        t1.set_allocation_domain([ids[0], ids[0], ids[1], ids[2]])
    with pytest.raises(ValueError, match=r"not derived from the logical domain"):
        t1.set_allocation_domain([*ids[:2], t0.get_logical_domain()[2]])


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda: torch.randn(3, 4), r"input 0 \(T0\) axis 0: stride 4 is larger than axis 1's stride 1, but the declared "
                                r"stride order puts axis 0 inside axis 1"),
    (lambda: torch.randn(8, 3).t()[:, ::2], r"input 0 \(T0\) axis 1: declared contiguous, so its stride must be 3, "
                                            r"but got stride 6"),
])
def test_input_strides_must_match_the_declared_layout(make: object, pattern: str) -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], contiguity=True, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(t0))
    with pytest.raises(ValueError, match=pattern):
        fd.execute([make()])  # type: ignore[operator]
    good = torch.randn(4, 3).t()
    torch.testing.assert_close(fd.execute([good])[0], torch.exp(good))


def test_every_permutation_of_a_4d_input_stride_order() -> None:
    """All 24 declared input layouts validate and propagate (a hint) to a pointwise output."""
    shape = SHAPES[4]
    for order in itertools.permutations(range(4)):
        x = strided_like(shape, list(order))
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1] * 4, contiguity=True, stride_order=list(order))
            fd.add_output(fd.ops.abs(t0))
        (out,) = fd.execute([x])
        assert out.stride() == x.stride(), order
        torch.testing.assert_close(out, x.abs())


def test_user_allocation_domain_on_an_input_is_a_requirement() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], contiguity=True)
        fd.add_output(fd.ops.exp(t0))
    a, b, c = t0.get_logical_domain()
    t0.set_allocation_domain([c, a, b])
    x = torch.randn(5, 3, 4).permute(1, 2, 0)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x.exp())
    assert out.stride() == x.stride(), "the required input layout flows to the output as a hint"
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 0: stride 20 is larger than axis 2's stride 1"):
        fd.execute([torch.randn(3, 4, 5)])


def test_required_allocation_no_strided_tensor_can_have_is_rejected() -> None:
    """``[i0, 2, ceilDiv(i1, 2)]`` (a split of i1 with its halves swapped) has no stride pattern: it
    was accepted and the output silently came back row-major. ``[i0, ceilDiv(i1, 2), 2]`` is plain
    row-major and stays accepted."""
    x = torch.randn(4, 6)
    for swapped in (False, True):
        with FusionDefinition() as fd:
            out = fd.ops.exp(fd.define_tensor([-1, -1]))
            fd.add_output(out)
        out.split(1, 2)
        i0, outer, inner = out.get_loop_domain()
        out.set_allocation_domain([i0, inner, outer] if swapped else [i0, outer, inner], True)
        if not swapped:
            (result,) = fd.execute([x])
            torch.testing.assert_close(result, x.exp())
            assert result.stride() == (6, 1)
            continue
        with pytest.raises(ValueError, match=r"T1: required allocation domain \(iS\d+\{i0\}, iS\d+\{2\}, .*\) puts "
                                             r"iS\d+\{2\} outside iS\d+\{\( ceilDiv\(i1, 2\) \)\}, which no strided"):
            fd.execute([x])
