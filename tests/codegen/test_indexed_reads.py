"""gather / take_along_axis, index_select and embedding inside generated kernels: the lookup tensor (a
segment input) read at the index's values, the index and the output iterated by the loop nest. Against
torch on odd shapes, float32 and bfloat16, permuted and expanded (stride-0) indices, a non-contiguous
lookup tensor, an index computed in the kernel, empty tensors and indices out of range; fused into a
pointwise kernel and into a softmax (DeBERTa's relative-position attention)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyfuser import DataType, FusionDefinition
from tests.codegen.conftest import RunKernels, kernel_schedulers

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _gather_fusion(op: str, arg: torch.Tensor, index: torch.Tensor, dim: int) -> FusionDefinition:
    """``exp(op(arg, index, dim)) * 2`` from tensors declared like the examples (strides included)."""
    with FusionDefinition() as fd:
        x = fd.from_pytorch(arg)
        i = fd.from_pytorch(index)
        g = fd.ops.gather(x, i, dim) if op == "gather" else fd.ops.take_along_axis(x, i, dim)
        fd.add_output(fd.ops.mul(fd.ops.exp(g), 2.0))
    return fd


def _only_kernels(fd: FusionDefinition) -> list[str]:
    """The schedulers of the kernels the latest execution launched, checking it made no ATen call (the
    indexed read ran inside a kernel)."""
    nodes = [type(n).__name__ for n in fd.fec.last_program.container.walk()]
    assert "AtenCall" not in nodes, nodes
    return kernel_schedulers(fd)


def _expected(arg: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    return (torch.gather(arg.float(), dim, index).exp() * 2).to(arg.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_take_along_axis_in_a_pointwise_kernel(device: str, run_kernels: RunKernels, dtype: torch.dtype,
                                               dim: int) -> None:
    arg = torch.randn(5, 7, 3, device=device).to(dtype)
    shape = [5, 7, 3]
    shape[dim] = 4
    index = torch.randint(0, arg.shape[dim], shape, device=device)
    fd = _gather_fusion("take_along_axis", arg, index, dim)
    (out,) = run_kernels(fd, [arg, index])
    torch.testing.assert_close(out, _expected(arg, index, dim))
    assert _only_kernels(fd) == ["pointwise"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_gather_with_an_index_shorter_than_its_lookup(device: str, run_kernels: RunKernels, dtype: torch.dtype) -> None:
    """``gather``'s index may be shorter than the lookup tensor off ``dim``: those axes read the lookup
    tensor at the output's positions, with the lookup's own strides."""
    arg = torch.randn(6, 9, 5, device=device).to(dtype)
    index = torch.randint(0, 9, (4, 3, 2), device=device)
    fd = _gather_fusion("gather", arg, index, 1)
    (out,) = run_kernels(fd, [arg, index])
    torch.testing.assert_close(out, _expected(arg, index, 1))
    assert _only_kernels(fd) == ["pointwise"]


def test_permuted_index_and_non_contiguous_lookup(device: str, run_kernels: RunKernels) -> None:
    """A transposed index (its innermost axis in memory is not the output's) and a lookup tensor that is
    a strided slice of a larger one."""
    base = torch.randn(5, 20, 6, device=device)
    arg = base[:, ::2, :].transpose(0, 2)  # [6, 10, 5], no axis contiguous
    index = torch.randint(0, 10, (5, 7, 6), device=device).permute(2, 1, 0)  # [6, 7, 5]
    fd = _gather_fusion("gather", arg, index, 1)
    (out,) = run_kernels(fd, [arg, index])
    torch.testing.assert_close(out, _expected(arg, index, 1))
    assert _only_kernels(fd) == ["pointwise"]


def test_expanded_index(device: str, run_kernels: RunKernels) -> None:
    """An index broadcast over the batch (stride 0), as DeBERTa expands its relative positions."""
    arg = torch.randn(3, 5, 8, device=device)
    index = torch.randint(0, 8, (1, 5, 5), device=device).expand(3, 5, 5)
    fd = _gather_fusion("gather", arg, index, 2)
    (out,) = run_kernels(fd, [arg, index])
    torch.testing.assert_close(out, _expected(arg, index, 2))
    assert _only_kernels(fd) == ["pointwise"]


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_computed_in_the_kernel(device: str, run_kernels: RunKernels, index_dtype: torch.dtype) -> None:
    """``clamp(positions + span, 0, 2 * span - 1)`` expanded over the batch, computed where the gather reads
    it: one kernel reads the positions and the lookup tensor, no index tensor is written."""
    span = 4
    arg = torch.randn(6, 5, 2 * span, device=device)
    rel = (torch.arange(5)[:, None] - torch.arange(5)[None, :] * 2).to(device, index_dtype)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(arg)
        r = fd.from_pytorch(rel)
        index = fd.ops.clamp(fd.ops.add(r, span), 0, 2 * span - 1)
        expanded = fd.ops.expand(fd.ops.broadcast(index, [True, False, False]), [6, 5, 5])
        fd.add_output(fd.ops.gather(x, expanded, 2))
    (out,) = run_kernels(fd, [arg, rel])
    want = torch.gather(arg, 2, (rel.long() + span).clamp(0, 2 * span - 1).expand(6, 5, 5))
    torch.testing.assert_close(out, want)
    assert _only_kernels(fd) == ["pointwise"]


def _relative_softmax(dtype: DataType, span: int, transposed: bool) -> FusionDefinition:
    """DeBERTa's attention scores: ``softmax(where(mask, scores + c2p / scale + p2c^T / scale, min))``,
    c2p and p2c gathered from [B*H, S, 2 * span] along their last axis at the clamped relative positions
    (p2c not transposed unless ``transposed``)."""
    with FusionDefinition() as fd:
        scores = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=dtype)
        c2p = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=dtype)
        p2c = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=dtype)
        rel = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Int)
        mask = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Bool)
        b, s = fd.ops.size(scores, 0), fd.ops.size(scores, 1)

        def positions(r: object) -> object:
            index = fd.ops.clamp(fd.ops.add(r, span), 0, 2 * span - 1)
            return fd.ops.expand(fd.ops.broadcast(index, [True, False, False]), [b, s, s])

        c2p_att = fd.ops.take_along_axis(c2p, positions(rel), 2)
        p2c_att = fd.ops.take_along_axis(p2c, positions(fd.ops.neg(rel)), 2)
        if transposed:
            p2c_att = fd.ops.permute(p2c_att, [0, 2, 1])
        bias = fd.ops.add(fd.ops.cast(c2p_att, DataType.Float), fd.ops.cast(p2c_att, DataType.Float))
        y = fd.ops.add(fd.ops.cast(scores, DataType.Float), fd.ops.div(bias, 3.0))
        y = fd.ops.where(fd.ops.broadcast(mask, [True, False, False]), y, -1e30)
        m = fd.ops.max(y, [2], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(y, m))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [2], keepdim=True)), dtype))
    return fd


def _relative_softmax_reference(scores: torch.Tensor, c2p: torch.Tensor, p2c: torch.Tensor, rel: torch.Tensor,
                                mask: torch.Tensor, span: int, transposed: bool) -> torch.Tensor:
    b, s = scores.shape[:2]
    c2p_att = torch.gather(c2p, 2, (rel + span).clamp(0, 2 * span - 1).expand(b, s, s))
    p2c_att = torch.gather(p2c, 2, (-rel + span).clamp(0, 2 * span - 1).expand(b, s, s))
    if transposed:
        p2c_att = p2c_att.transpose(1, 2)
    y = scores.float() + (c2p_att.float() + p2c_att.float()) / 3.0
    return torch.softmax(torch.where(mask, y, -1e30), -1).to(scores.dtype)


def _relative_inputs(device: str, dtype: torch.dtype, span: int) -> list[torch.Tensor]:
    b, s = 6, 9
    scores = torch.randn(b, s, s, device=device).to(dtype)
    c2p = torch.randn(b, s, 2 * span, device=device).to(dtype)
    p2c = torch.randn(b, s, 2 * span, device=device).to(dtype)
    rel = (torch.arange(s)[:, None] - torch.arange(s)[None, :]).to(device)
    mask = torch.rand(s, s, device=device) > 0.2
    return [scores, c2p, p2c, rel, mask]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_gathers_fused_into_a_softmax(device: str, run_kernels: RunKernels, dtype: torch.dtype) -> None:
    """Both relative-position gathers, the adds, the mask and the softmax in one inner persistent kernel
    (Inductor's one reduction kernel per layer)."""
    span = 4
    inputs = _relative_inputs(device, dtype, span)
    fd = _relative_softmax(DTYPES[dtype], span, transposed=False)
    (out,) = run_kernels(fd, inputs)
    torch.testing.assert_close(out, _relative_softmax_reference(*inputs, span, transposed=False))
    assert _only_kernels(fd) == ["inner_persistent"]


def test_transposed_gather_beside_a_softmax(device: str, run_kernels: RunKernels) -> None:
    """DeBERTa's p2c is transposed before it is added: over a square [S, S] both axes of the scores are
    then one axis class, and the reduction analysis keeps the softmax of such values in a kernel of its
    own (it cannot tell a reduced value read along the other axis); the gathers, the transpose and the
    adds are computed by the kernel before it, no ATen call."""
    span = 4
    inputs = _relative_inputs(device, torch.float32, span)
    fd = _relative_softmax(DataType.Float, span, transposed=True)
    (out,) = run_kernels(fd, inputs)
    torch.testing.assert_close(out, _relative_softmax_reference(*inputs, span, transposed=True))
    assert _only_kernels(fd) == ["inner_persistent", "inner_persistent"]


def test_a_lookup_tensor_computed_in_the_fusion_is_another_kernels_output(device: str, run_kernels: RunKernels) -> None:
    """The lookup tensor is read at indexed positions from global memory: where the fusion computes it
    (``exp(x)``), another kernel writes it and the gather's kernel reads it."""
    x = torch.randn(4, 9, device=device)
    index = torch.randint(0, 9, (4, 5), device=device)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        i = fd.from_pytorch(index)
        fd.add_output(fd.ops.mul(fd.ops.gather(fd.ops.exp(t), i, 1), 3.0))
    (out,) = run_kernels(fd, [x, index])
    torch.testing.assert_close(out, torch.gather(x.exp(), 1, index) * 3)
    assert _only_kernels(fd) == ["pointwise", "pointwise"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_index_select_and_embedding_in_kernels(device: str, run_kernels: RunKernels, dtype: torch.dtype) -> None:
    """index_select along a middle axis of a transposed tensor and an embedding with int32 ids, each read
    by a pointwise op in the kernel that computes the lookup."""
    arg = torch.randn(7, 5, 3, device=device).to(dtype).transpose(0, 2)  # [3, 5, 7]
    picks = torch.tensor([4, 0, 4, 2], device=device)
    weight = torch.randn(11, 6, device=device).to(dtype)
    ids = torch.randint(0, 11, (2, 3), device=device, dtype=torch.int32)
    with FusionDefinition() as fd:
        a = fd.from_pytorch(arg)
        p = fd.from_pytorch(picks)
        w = fd.from_pytorch(weight)
        i = fd.from_pytorch(ids)
        fd.add_output(fd.ops.neg(fd.ops.index_select(a, p, 1)))
        fd.add_output(fd.ops.mul(fd.ops.embedding_fwd(i, w), 2.0))
    selected, embedded = run_kernels(fd, [arg, picks, weight, ids])
    torch.testing.assert_close(selected, -arg.index_select(1, picks))
    torch.testing.assert_close(embedded, (torch.nn.functional.embedding(ids.long(), weight.float()) * 2).to(dtype))
    assert _only_kernels(fd) == ["pointwise", "pointwise"]


def test_embedding_into_a_layer_norm(device: str, run_kernels: RunKernels) -> None:
    """Token and position embeddings summed and layer-normed (BERT's embeddings) in one kernel."""
    words, positions = torch.randn(13, 8, device=device), torch.randn(6, 8, device=device)
    ids = torch.randint(0, 13, (2, 5), device=device)
    pos = torch.arange(5, device=device)
    with FusionDefinition() as fd:
        w, p = fd.from_pytorch(words), fd.from_pytorch(positions)
        i, q = fd.from_pytorch(ids), fd.from_pytorch(pos)
        x = fd.ops.add(fd.ops.embedding_fwd(i, w), fd.ops.broadcast(fd.ops.embedding_fwd(q, p), [True, False, False]))
        var, mean = fd.ops.var_mean(x, [2], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    (out,) = run_kernels(fd, [words, positions, ids, pos])
    x = words[ids] + positions[pos]
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, [8], eps=1e-5))
    assert _only_kernels(fd) == ["inner_persistent"]


@pytest.mark.parametrize("op", ["gather", "take_along_axis"])
def test_empty_tensors(device: str, run_kernels: RunKernels, op: str) -> None:
    arg = torch.randn(3, 0, 4, device=device) if op == "gather" else torch.randn(3, 5, 4, device=device)
    index = torch.zeros(3, 0, 4, dtype=torch.long, device=device) if op == "gather" else \
        torch.zeros(0, 5, 4, dtype=torch.long, device=device)
    dim = 1 if op == "gather" else 0
    fd = _gather_fusion(op, arg, index, dim)
    (out,) = run_kernels(fd, [arg, index])
    assert out.shape == index.shape
    assert _only_kernels(fd) == ["pointwise"]


@pytest.mark.parametrize("bad", [9, -1])
def test_index_out_of_range_is_an_error(run_kernels: RunKernels, bad: int) -> None:
    """An index out of range is never read (the load is masked by the range): through the interpreter it
    is a ValueError naming the op, the index and the lookup tensor's axis (on a GPU, a device-side
    assert: ``test_index_out_of_range_on_a_gpu_is_a_device_assert``). Lanes past the end of the tile
    read no index and raise nothing."""
    arg = torch.randn(3, 9)
    index = torch.randint(0, 9, (3, 5))
    fd = _gather_fusion("take_along_axis", arg, index, 1)
    run_kernels(fd, [arg, index])
    index[2, 3] = bad
    with pytest.raises(ValueError, match=r"take_along_axis: index T1 holds a value out of range for T0 axis 1"):
        run_kernels(fd, [arg, index])


def test_computed_index_out_of_range_is_an_error_in_a_softmax(run_kernels: RunKernels) -> None:
    """An index the kernel computes (positions + span, not clamped) out of range, in an inner persistent
    kernel."""
    with FusionDefinition() as fd:
        scores = fd.define_tensor([-1, -1, -1], contiguity=True)
        c2p = fd.define_tensor([-1, -1, -1], contiguity=True)
        rel = fd.define_tensor([-1, -1, -1], contiguity=True, dtype=DataType.Int)
        y = fd.ops.add(scores, fd.ops.take_along_axis(c2p, fd.ops.add(rel, 2), 2))
        m = fd.ops.max(y, [2], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(y, m))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [2], keepdim=True)))
    scores, c2p = torch.randn(2, 3, 5), torch.randn(2, 3, 4)
    rel = torch.randint(-2, 2, (2, 3, 5))
    (out,) = run_kernels(fd, [scores, c2p, rel])
    torch.testing.assert_close(out, torch.softmax(scores + torch.gather(c2p, 2, rel + 2), -1))
    assert _only_kernels(fd) == ["inner_persistent"]
    rel[1, 2, 4] = 2
    with pytest.raises(ValueError, match=r"take_along_axis: index T\d+ holds a value out of range for T1 axis 2"):
        run_kernels(fd, [scores, c2p, rel])


def test_gather_index_longer_than_its_lookup_is_an_error(run_kernels: RunKernels) -> None:
    """Off ``dim`` a gather's index may not be longer than the lookup tensor (checked at launch: the
    kernel reads the lookup tensor at the index's positions there)."""
    arg, index = torch.randn(4, 7, 3), torch.randint(0, 7, (3, 5, 3))
    fd = _gather_fusion("gather", arg, index, 1)
    run_kernels(fd, [arg, index])
    with pytest.raises(ValueError, match=r"gather: index T1 axis 0 is longer than T0 axis 0"):
        run_kernels(fd, [arg, torch.randint(0, 7, (5, 5, 3))])


@st.composite
def _gathers(draw: st.DrawFn) -> tuple[str, list[int], list[int], int, tuple[int, ...]]:
    rank = draw(st.integers(1, 3))
    dim = draw(st.integers(0, rank - 1))
    op = draw(st.sampled_from(["gather", "take_along_axis"]))
    arg_shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    index_shape = [draw(st.integers(0, 6)) if d == dim else
                   (draw(st.integers(0, arg_shape[d])) if op == "gather" else arg_shape[d]) for d in range(rank)]
    order = tuple(draw(st.permutations(range(rank))))
    return op, arg_shape, index_shape, dim, order


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_gathers(), seed=st.integers(0, 2**16))
def test_random_gathers_match_torch(run_kernels: RunKernels, case: tuple[str, list[int], list[int], int, tuple[int, ...]],
                                    seed: int) -> None:
    """Random ranks, extents (empty index axes too), axes and index layouts."""
    op, arg_shape, index_shape, dim, order = case
    g = torch.Generator().manual_seed(seed)
    arg = torch.randn(arg_shape, generator=g)
    permuted = [index_shape[p] for p in order]
    index = torch.randint(0, arg_shape[dim], permuted, generator=g).permute(
        [order.index(d) for d in range(len(order))])
    assert list(index.shape) == index_shape
    fd = _gather_fusion(op, arg, index, dim)
    (out,) = run_kernels(fd, [arg, index])
    torch.testing.assert_close(out, _expected(arg, index, dim))
    # one kernel: the pointwise scheduler's, or the transpose scheduler's where the index's layout is
    # permuted against the output's
    assert len(_only_kernels(fd)) == 1 and _only_kernels(fd)[0] in ("pointwise", "transpose"), _only_kernels(fd)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_index_out_of_range_on_a_gpu_is_a_device_assert(tmp_path: Path) -> None:
    """On a GPU the kernel asserts the index on the device, as ATen's gather does (a child process: a
    device assert leaves the CUDA context unusable); an in-range call reads nothing back to the host."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import torch
        from pyfuser import FusionDefinition
        arg, index = torch.randn(3, 9, device="cuda"), torch.randint(0, 9, (3, 5), device="cuda")
        with FusionDefinition() as fd:
            x, i = fd.from_pytorch(arg), fd.from_pytorch(index)
            fd.add_output(fd.ops.exp(fd.ops.take_along_axis(x, i, 1)))
        torch.testing.assert_close(fd.execute([arg, index])[0], torch.gather(arg, 1, index).exp())
        assert "tl.device_assert" in fd.last_kernel_code()
        index[1, 1] = 9
        fd.execute([arg, index])
        torch.cuda.synchronize()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != 0 and "device-side assert" in done.stderr, (done.returncode, done.stderr[-3000:])


# --- index: torch's advanced indexing by integer tensors --------------------------------------------------


def _index_fusion(arg: torch.Tensor, indices: list[torch.Tensor | None]) -> FusionDefinition:
    """``arg[indices] * 2`` from tensors declared like the examples (strides included)."""
    with FusionDefinition() as fd:
        x = fd.from_pytorch(arg)
        given = [None if i is None else fd.from_pytorch(i) for i in indices]
        fd.add_output(fd.ops.mul(fd.ops.index(x, given), 2.0))
    return fd


def _index_expected(arg: torch.Tensor, indices: list[torch.Tensor | None]) -> torch.Tensor:
    """``aten.index.Tensor``'s result, the op ``fd.ops.index`` is: Python's ``arg[...]`` reads a 0-dim index
    tensor as an integer (a basic index), so with another index apart it places the index axes elsewhere."""
    return (torch.ops.aten.index.Tensor(arg.float(), indices) * 2).to(arg.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("where", ["adjacent", "apart", "first", "last"])
def test_index_by_broadcasting_tensors(device: str, run_kernels: RunKernels, dtype: torch.dtype, where: str) -> None:
    """Index tensors of shapes [4, 1] and [1, 6] broadcast into a [4, 6] index shape, which stands where the
    indexed axes were when they are adjacent and first when they are apart (torch's rule); negative values
    count from the end; one kernel, no ATen call."""
    arg = torch.randn(3, 5, 7, 2, device=device).to(dtype)
    dims = {"adjacent": (1, 2), "apart": (0, 2), "first": (0, 1), "last": (2, 3)}[where]
    rows = torch.randint(-arg.shape[dims[0]], arg.shape[dims[0]], (4, 1), device=device)
    cols = torch.randint(-arg.shape[dims[1]], arg.shape[dims[1]], (1, 6), device=device, dtype=torch.int32)
    indices: list[torch.Tensor | None] = [None] * (dims[1] + 1)
    indices[dims[0]], indices[dims[1]] = rows, cols
    fd = _index_fusion(arg, indices)
    (out,) = run_kernels(fd, [arg, *[i for i in indices if i is not None]])
    torch.testing.assert_close(out, _index_expected(arg, indices))
    assert len(_only_kernels(fd)) == 1


def test_index_of_an_expanded_lookup_by_a_computed_index_into_a_softmax(device: str, run_kernels: RunKernels) -> None:
    """A sliding-window mask as ``transformers`` builds it: positions (an expanded [B, S] lookup) and a
    cumulative sum read at [B, 1, S, 1] and [B, 1, 1, S] index tensors, compared, and applied to scores
    whose softmax the same kernel computes (Inductor's one kernel)."""
    b, h, s = 2, 3, 9
    scores = torch.randn(b, h, s, s, device=device)
    positions = torch.arange(s, device=device)[None].expand(b, s)
    segments = torch.randint(0, 2, (b, s), device=device).cumsum(-1)
    batch = torch.arange(b, device=device)[:, None, None, None]
    query, key = torch.arange(s, device=device)[None, None, :, None], torch.arange(s, device=device)[None, None, None, :]
    with FusionDefinition() as fd:
        t_scores, t_pos, t_seg, t_b, t_q, t_k = (fd.from_pytorch(t) for t in (scores, positions, segments, batch,
                                                                              query, key))
        causal = fd.ops.le(fd.ops.index(t_pos, [t_b, t_k]), fd.ops.index(t_pos, [t_b, t_q]))
        window = fd.ops.gt(fd.ops.index(t_pos, [t_b, t_k]), fd.ops.sub(fd.ops.index(t_pos, [t_b, t_q]), 4))
        same = fd.ops.eq(fd.ops.index(t_seg, [t_b, t_q]), fd.ops.index(t_seg, [t_b, t_k]))
        keep = fd.ops.bitwise_and(fd.ops.bitwise_and(causal, window), same)
        y = fd.ops.where(keep, t_scores, float("-inf"))
        e = fd.ops.exp(fd.ops.sub(y, fd.ops.max(y, [3], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [3], keepdim=True)))
    (out,) = run_kernels(fd, [scores, positions, segments, batch, query, key])
    pq, pk = positions[batch, query], positions[batch, key]
    keep = (pk <= pq) & (pk > pq - 4) & (segments[batch, query] == segments[batch, key])
    torch.testing.assert_close(out, torch.softmax(scores.masked_fill(~keep, float("-inf")), -1))
    assert _only_kernels(fd) == ["inner_persistent"]


def test_index_out_of_range_and_bad_definitions_are_errors(run_kernels: RunKernels) -> None:
    """A value out of ``[-size, size)`` is a ValueError naming the index and the lookup's axis (never
    read); no index tensor, too many indices or a floating index are refused at definition."""
    arg = torch.randn(4, 6)
    rows, cols = torch.randint(-4, 4, (3, 1)), torch.randint(0, 6, (5,))
    fd = _index_fusion(arg, [rows, cols])
    (out,) = run_kernels(fd, [arg, rows, cols])
    torch.testing.assert_close(out, _index_expected(arg, [rows, cols]))
    for bad in (6, -7):
        wrong = cols.clone()
        wrong[3] = bad
        with pytest.raises(ValueError, match=r"index: index T2 holds a value out of range for T0 axis 1"):
            run_kernels(fd, [arg, rows, wrong])
    with FusionDefinition() as fd2:
        x = fd2.from_pytorch(arg)
        with pytest.raises(ValueError, match="no index tensor"):
            fd2.ops.index(x, [None, None])
        with pytest.raises(ValueError, match="3 indices for T0 of rank 2"):
            fd2.ops.index(x, [None, None, fd2.from_pytorch(cols)])
        with pytest.raises(TypeError, match=r"index: index T\d+ has dtype float"):
            fd2.ops.index(x, [fd2.from_pytorch(torch.randn(3))])


@st.composite
def _indexings(draw: st.DrawFn) -> tuple[list[int], list[list[int] | None], int]:
    rank = draw(st.integers(1, 4))
    arg_shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    width = draw(st.integers(0, 2))
    shape = draw(st.lists(st.integers(1, 4), min_size=width, max_size=width))
    count = draw(st.integers(1, rank))
    indexed = sorted(draw(st.permutations(range(rank)))[:count])
    indices: list[list[int] | None] = [None] * (max(indexed) + 1)
    for d in indexed:  # each index's shape: a suffix of the index shape, some extents broadcast (1)
        own = shape[draw(st.integers(0, width)):]
        indices[d] = [draw(st.sampled_from([1, e])) for e in own]
    return arg_shape, indices, draw(st.integers(0, 2**16))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_indexings())
@example(case=([1, 1, 2, 1], [[], None, None, [1]], 0))  # a 0-dim index apart from another: aten's placement
def test_random_indexing_matches_torch(run_kernels: RunKernels, case: tuple[list[int], list[list[int] | None], int]) -> None:
    """Random ranks, indexed axes (adjacent or apart), index ranks and broadcast extents, negative values,
    and a permuted lookup tensor: one kernel against torch's indexing."""
    arg_shape, shapes, seed = case
    g = torch.Generator().manual_seed(seed)
    arg = torch.randn(list(reversed(arg_shape)), generator=g).permute(list(reversed(range(len(arg_shape)))))
    indices = [None if s is None else torch.randint(-arg_shape[d], arg_shape[d], s, generator=g)
               for d, s in enumerate(shapes)]
    fd = _index_fusion(arg, indices)
    (out,) = run_kernels(fd, [arg, *[i for i in indices if i is not None]])
    torch.testing.assert_close(out, _index_expected(arg, indices))
    assert len(_only_kernels(fd)) == 1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=["int64", "int32", "bool"])
def test_embedding_of_integer_and_boolean_tables(device: str, run_kernels: RunKernels, dtype: torch.dtype) -> None:
    """``F.embedding`` takes a table of any dtype (a lookup of token types, of flags): its rows read in a
    kernel, as torch's."""
    table = (torch.randn(7, 3, device=device) * 4).to(dtype)
    tokens = torch.randint(0, 7, (2, 5), device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.embedding_fwd(fd.from_pytorch(tokens), fd.from_pytorch(table)))
    (out,) = run_kernels(fd, [tokens, table])
    assert out.dtype == dtype and torch.equal(out, torch.nn.functional.embedding(tokens, table))
    assert len(_only_kernels(fd)) == 1


def test_index_by_a_0_dim_tensor_is_a_copy(device: str, run_kernels: RunKernels) -> None:
    """A 0-dim index drops its axis (torch's ``x[:, t]``); the output owns its memory on every path (Python
    indexing by a 0-dim tensor would be a view of the input)."""
    x = torch.randn(4, 3, device=device)
    at = torch.tensor(-2, device=device)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.index(fd.from_pytorch(x), [None, fd.from_pytorch(at)]))
    for out in (fd.execute([x, at], device=device)[0], run_kernels(fd, [x, at])[0]):
        torch.testing.assert_close(out, x[:, -2])
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
