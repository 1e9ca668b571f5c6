"""The scatter scheduler: ``index_put_accumulate`` (an embedding's backward) as atomic adds in a
generated kernel, against ATen's accumulating ``index_put`` on the same data; ``index_put`` without
accumulation (an MoE's inverse permutation) as stores, against ATen's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.kernel_sequence import ScatterSequence
from tests.codegen.conftest import RunKernels, kernel_schedulers, kernel_segments

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half,
          torch.float64: DataType.Double}


def _embedding_backward(grad: torch.Tensor, index: torch.Tensor, vocab: int | None) -> FusionDefinition:
    """The weight's gradient as the kernel benchmark and an embedding's backward compute it: float32
    rows summed into a zero table, cast back to the gradient's dtype. ``vocab`` None: a scalar input."""
    with FusionDefinition() as fd:
        g, i = fd.from_pytorch(grad), fd.from_pytorch(index)
        rows = fd.define_scalar(None, DataType.Int) if vocab is None else vocab
        acc = fd.ops.full([rows, grad.shape[1]], 0.0, DataType.Float)
        summed = fd.ops.index_put_accumulate(acc, i, fd.ops.cast(g, DataType.Float))
        fd.add_output(fd.ops.cast(summed, DTYPES[grad.dtype]))
    return fd


def _reference(grad: torch.Tensor, index: torch.Tensor, vocab: int) -> torch.Tensor:
    acc = torch.zeros(vocab, grad.shape[1], dtype=torch.float64)
    return acc.index_put_((index.long(),), grad.double(), accumulate=True).to(grad.dtype)


@pytest.fixture
def nondeterministic() -> Iterator[None]:
    """The test runs with torch's default (atomic adds allowed), whatever the session set."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize(("tokens", "hidden", "vocab"), [(37, 33, 11), (1, 5, 3), (300, 8, 2), (64, 129, 1000)])
def test_embedding_backward_is_one_scatter_kernel(run_kernels: RunKernels, dtype: torch.dtype, tokens: int,
                                                  hidden: int, vocab: int, device: str) -> None:
    grad = torch.randn(tokens, hidden, dtype=dtype, device=device)
    index = torch.randint(0, vocab, (tokens,), device=device)
    index[: tokens // 2] = index[0]  # many duplicates: additions into one row from many programs
    fd = _embedding_backward(grad, index, None)
    (out,) = run_kernels(fd, [grad, index, vocab])
    # the float32 accumulator is the float32 gradient itself; other dtypes cast it in a kernel of its own
    assert kernel_schedulers(fd) == (["scatter"] if dtype is torch.float32 else ["scatter", "pointwise"])
    assert isinstance(kernel_segments(fd)[0], ScatterSequence)
    torch.testing.assert_close(out.cpu(), _reference(grad.cpu(), index.cpu(), vocab))
    assert "tl.atomic_add" in fd.last_kernel_code()


@pytest.mark.usefixtures("nondeterministic")
def test_scatter_reads_strided_values_and_int32_indices(run_kernels: RunKernels, device: str) -> None:
    """A transposed gradient (column-major rows) and 32-bit indices; the vocabulary a constant."""
    grad = torch.randn(24, 19, device=device).t()  # [19, 24], strides (1, 19)
    index = torch.randint(0, 7, (19,), dtype=torch.int32, device=device)
    fd = _embedding_backward(grad, index, 7)
    (out,) = run_kernels(fd, [grad, index])
    assert kernel_schedulers(fd) == ["scatter"]  # float32: written by the scatter, no copy after it
    torch.testing.assert_close(out.cpu(), _reference(grad.cpu(), index.cpu(), 7))


@pytest.mark.usefixtures("nondeterministic")
def test_scatter_into_an_input_adds_to_a_copy_of_it(run_kernels: RunKernels) -> None:
    """``acc`` a fusion input: the kernel adds into a copy (the input is left as it was), float64 too."""
    acc = torch.randn(6, 5, dtype=torch.float64)
    value = torch.randn(9, 5, dtype=torch.float64)
    index = torch.tensor([5, 0, 0, 3, 5, 5, 1, 0, 2])
    with FusionDefinition() as fd:
        a, i, v = fd.from_pytorch(acc), fd.from_pytorch(index), fd.from_pytorch(value)
        fd.add_output(fd.ops.index_put_accumulate(a, i, fd.ops.mul(v, 2.0)))
    before = acc.clone()
    (out,) = run_kernels(fd, [acc, index, value])
    assert kernel_schedulers(fd) == ["scatter"]
    torch.testing.assert_close(acc, before)
    torch.testing.assert_close(out, before.index_put((index,), value * 2.0, accumulate=True))


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_negative_indices_count_from_the_end_where_wrapped(run_kernels: RunKernels, device: str,
                                                           dtype: torch.dtype) -> None:
    """``wrap_negative`` (torch's ``index_put``, the backward of ``x[index]``): -1 is the last row, in the
    kernel and in the check; out of ``[-rows, rows)`` is still an error. Without it -1 is out of range."""
    acc = torch.randn(6, 5, device=device).to(dtype)
    value = torch.randn(9, 5, device=device).to(dtype)
    index = torch.tensor([5, -1, 0, -6, 5, -2, 1, 0, 2], device=device)
    with FusionDefinition() as fd:
        a, i, v = fd.from_pytorch(acc), fd.from_pytorch(index), fd.from_pytorch(value)
        fd.add_output(fd.ops.index_put_accumulate(a, i, v, wrap_negative=True))
    (out,) = run_kernels(fd, [acc, index, value])
    assert kernel_schedulers(fd) == ["scatter"]
    want = acc.float().index_put((index,), value.float(), accumulate=True)
    torch.testing.assert_close(out.float(), want)
    if device == "cpu":
        with pytest.raises(ValueError, match=r"index_put_accumulate: index T1 holds -7, out of range .* \(valid: -6..5\)"):
            run_kernels(fd, [acc, torch.tensor([0, -7]), value[:2]])
        with FusionDefinition() as strict:
            a, i, v = strict.from_pytorch(acc), strict.from_pytorch(index), strict.from_pytorch(value)
            strict.add_output(strict.ops.index_put_accumulate(a, i, v))
        with pytest.raises(ValueError, match=r"index_put_accumulate: index T1 holds -6, out of range"):
            run_kernels(strict, [acc, index, value])


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_put_stores_rows_at_their_indices(run_kernels: RunKernels, device: str, dtype: torch.dtype,
                                                index_dtype: torch.dtype) -> None:
    """``x[index] = value * 2`` of whole rows (any dtype: no atomics), negative indices wrapped, rows no
    index names keeping ``x``'s values, ``x`` itself left as it was; a [4, 3, 5] row shape and a
    permuted ``value`` read where it lies."""
    acc = torch.randn(9, 3, 5, device=device).to(dtype)
    value = torch.randn(5, 6, 3, device=device).to(dtype).permute(1, 2, 0)[:5]  # [5, 3, 5], strided
    index = torch.tensor([4, -1, 0, -7, 7], dtype=index_dtype, device=device)  # rows 4, 8, 0, 2, 7
    with FusionDefinition() as fd:
        a, i, v = fd.from_pytorch(acc), fd.from_pytorch(index), fd.from_pytorch(value)
        fd.add_output(fd.ops.index_put(a, i, fd.ops.mul(v, 2.0), wrap_negative=True))
    before = acc.clone()
    (out,) = run_kernels(fd, [acc, index, value])
    assert kernel_schedulers(fd) == ["scatter"]
    assert "tl.store" in fd.last_kernel_code() and "atomic" not in fd.last_kernel_code()
    torch.testing.assert_close(acc, before)
    torch.testing.assert_close(out, before.index_put((index.long(),), value * 2.0))
    if device == "cpu":
        with pytest.raises(ValueError, match=r"index_put: index T1 holds 9, out of range .* \(valid: -9..8\)"):
            run_kernels(fd, [acc, torch.tensor([0, 9], dtype=index_dtype), value[:2]])


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("accumulate", [True, False], ids=["add", "store"])
def test_a_single_row_written_by_one_lane_of_a_wide_tile(run_kernels: RunKernels, device: str,
                                                          accumulate: bool) -> None:
    """One row of one element (``acc`` a reduction kept as ``[1, 1, 1]``): the address is a scalar, the
    tile's other lanes read index 0 past the value's extent and must write nothing (a store of theirs
    overwrote the row with zeros); found by the fuzzer's index_put family."""
    x = torch.randn(1, 7, 2, device=device)
    value = torch.randn(1, 1, 1, device=device)
    with FusionDefinition() as fd:
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(value)
        acc = fd.ops.prod(t0, [0, 1, 2], keepdim=True, dtype=DataType.Float)
        index = fd.ops.remainder(fd.ops.iota(1, 0, 1, DataType.Int), 1)
        put = fd.ops.index_put_accumulate if accumulate else fd.ops.index_put
        fd.add_output(fd.ops.cat([acc, put(acc, index, t1)], 2))
    (out,) = run_kernels(fd, [x, value])
    product = x.double().prod().reshape(1, 1, 1)
    want = torch.cat([product, product + value.double() if accumulate else value.double()], 2)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("accumulate", [True, False], ids=["add", "store"])
def test_one_index_into_a_vector_with_a_value_of_symbolic_length(run_kernels: RunKernels, device: str,
                                                               accumulate: bool) -> None:
    """One index into a 1-D tensor (an element, a scalar address) with a value whose length is symbolic
    (1 at execution): the value's lanes join the mask, so the address is widened to a block (the
    interpreter refused a block value at a scalar address); found by the fuzzer (seed 9400847)."""
    x, value, index = torch.randn(4, device=device), torch.randn(1, device=device), torch.tensor([2], device=device)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([4], dtype=DataType.Float)
        t1 = fd.define_tensor([-1], dtype=DataType.Float)
        t2 = fd.define_tensor([1], dtype=DataType.Int)
        put = fd.ops.index_put_accumulate if accumulate else fd.ops.index_put
        fd.add_output(put(t0, fd.ops.remainder(t2, 4), t1))
    (out,) = run_kernels(fd, [x, value, index])
    torch.testing.assert_close(out, x.index_put((index,), value, accumulate=accumulate))


@pytest.mark.usefixtures("nondeterministic")
def test_rows_added_into_a_matmuls_result(run_kernels: RunKernels, device: str) -> None:
    """``acc`` a matmul's result, whose logical domain keeps the reduced axis: rows are compared with
    ``value``'s without it (found by the fuzzer)."""
    a, b = torch.randn(4, 3, device=device), torch.randn(3, device=device)
    value, index = torch.randn(5, device=device), torch.tensor([3, 0, 3, 1, 2], device=device)
    with FusionDefinition() as fd:
        ta, tb, tv, ti = (fd.from_pytorch(t) for t in (a, b, value, index))
        fd.add_output(fd.ops.index_put_accumulate(fd.ops.matmul(ta, tb), ti, tv))
    (out,) = run_kernels(fd, [a, b, value, index])
    torch.testing.assert_close(out, (a @ b).index_put((index,), value, accumulate=True), atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("nondeterministic")
def test_scatter_of_no_rows_is_the_initial_value(run_kernels: RunKernels) -> None:
    grad = torch.randn(0, 4)
    index = torch.zeros(0, dtype=torch.long)
    fd = _embedding_backward(grad, index, 3)
    (out,) = run_kernels(fd, [grad, index])
    torch.testing.assert_close(out, torch.zeros(3, 4))


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_range_index_is_an_error_naming_the_tensors(run_kernels: RunKernels, bad: int) -> None:
    grad = torch.randn(4, 3)
    index = torch.tensor([0, bad, 2, 1])
    fd = _embedding_backward(grad, index, 7 if bad < 0 else None)
    inputs = [grad, index] if bad < 0 else [grad, index, 7]
    with pytest.raises(ValueError, match=rf"index_put_accumulate: index T1 holds {bad}, out of range for T\d+ axis 0 "
                                         r"of size 7 \(valid: 0..6\)"):
        run_kernels(fd, inputs)


@pytest.mark.usefixtures("nondeterministic")
def test_rows_of_another_width_are_an_error(run_kernels: RunKernels) -> None:
    """``value``'s rows must be ``acc``'s: the launch compares the sizes (a kernel would write past them)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        i = fd.define_tensor([-1], dtype=DataType.Int)
        v = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.index_put_accumulate(fd.ops.mul(a, 1.0), i, v))
    with pytest.raises(ValueError, match=r"T\d axis 1 has size \d but T\d axis 1 has size \d; they must be equal"):
        run_kernels(fd, [torch.zeros(3, 4), torch.tensor([0, 1]), torch.randn(2, 5)])


def test_deterministic_algorithms_keep_atens_sorted_index_put(run_kernels: RunKernels) -> None:
    grad = torch.randn(10, 4)
    index = torch.randint(0, 5, (10,))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        fd = _embedding_backward(grad, index, 5)
        (out,) = run_kernels(fd, [grad, index])
    finally:
        torch.use_deterministic_algorithms(before)
    assert "scatter" not in kernel_schedulers(fd)
    torch.testing.assert_close(out, _reference(grad, index, 5))


@pytest.mark.usefixtures("nondeterministic")
def test_half_precision_accumulators_stay_aten(run_kernels: RunKernels) -> None:
    """A bfloat16 ``acc``: ATen sums each row in float32 and rounds once; atomic adds would round each
    addition, so the op is not a scatter kernel."""
    grad = torch.randn(10, 4, dtype=torch.bfloat16)
    index = torch.randint(0, 5, (10,))
    with FusionDefinition() as fd:
        g, i = fd.from_pytorch(grad), fd.from_pytorch(index)
        acc = fd.ops.full([5, 4], 0.0, DataType.BFloat16)
        fd.add_output(fd.ops.index_put_accumulate(acc, i, fd.ops.cast(fd.ops.mul(g, 1.0), DataType.BFloat16)))
    (out,) = run_kernels(fd, [grad, index])
    assert "scatter" not in kernel_schedulers(fd)
    want = torch.zeros(5, 4, dtype=torch.bfloat16).index_put((index,), grad, accumulate=True)
    torch.testing.assert_close(out, want)


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("computed", [True, False])
def test_deterministic_algorithms_turned_on_after_compiling_use_atens_index_put(
        run_kernels: RunKernels, computed: bool) -> None:
    """A segment compiled with atomic adds honours the flag turned on later: its rows computed by a
    kernel of their own (or read from the input) and added by ATen's sorted index_put."""
    grad = torch.randn(13, 6, dtype=torch.bfloat16 if computed else torch.float32)
    index = torch.randint(0, 4, (13,))
    if computed:
        fd = _embedding_backward(grad, index, 4)
    else:
        with FusionDefinition() as fd:
            g, i = fd.from_pytorch(grad), fd.from_pytorch(index)
            fd.add_output(fd.ops.index_put_accumulate(fd.ops.full([4, 6], 0.0, DataType.Float), i, g))
    run_kernels(fd, [grad, index])
    (segment,) = [s for s in kernel_segments(fd) if isinstance(s, ScatterSequence)]

    def atomic(*args: object, **kwargs: object) -> None:
        raise AssertionError("atomic adds under torch.use_deterministic_algorithms(True)")

    segment.parts.scatter.run = atomic  # type: ignore[method-assign]
    torch.use_deterministic_algorithms(True)
    (out,) = run_kernels(fd, [grad, index])
    torch.testing.assert_close(out, _reference(grad, index, 4))


@pytest.mark.usefixtures("nondeterministic")
def test_integer_rows_add_exactly(run_kernels: RunKernels) -> None:
    value = torch.randint(-5, 5, (7, 3), dtype=torch.int32)
    index = torch.tensor([0, 4, 4, 1, 0, 2, 4])
    with FusionDefinition() as fd:
        v, i = fd.from_pytorch(value), fd.from_pytorch(index)
        fd.add_output(fd.ops.index_put_accumulate(fd.ops.full([5, 3], 0, DataType.Int32), i, v))
    (out,) = run_kernels(fd, [value, index])
    assert kernel_schedulers(fd) == ["scatter"]
    assert torch.equal(out, torch.zeros(5, 3, dtype=torch.int32).index_put((index,), value, accumulate=True))


@pytest.mark.usefixtures("nondeterministic")
@pytest.mark.parametrize("acc_kind", ["computed", "input"])
def test_a_bound_program_replays_its_scatter(monkeypatch: pytest.MonkeyPatch, device: str, acc_kind: str) -> None:
    """Under a binding (a torch.compile region's later calls) a scatter segment replays its launches --
    the buffer (the init kernel's launch, or a copy of an input ``acc``), then the adds into it --
    without its launcher: each call's values, indices and ``acc`` are read afresh, and the result is a
    new tensor. Where no device assert checks the indices (Triton's interpreter) the replay checks them."""
    torch.manual_seed(0)
    acc, grad, index = torch.randn(5, 3, device=device), torch.randn(6, 3, device=device), \
        torch.tensor([0, 4, 2, 4, 0, 1], device=device)
    with FusionDefinition() as fd:
        a, g, i = fd.from_pytorch(acc), fd.from_pytorch(grad), fd.from_pytorch(index)
        start = fd.ops.mul(a, 2.0) if acc_kind == "computed" else a
        fd.add_output(fd.ops.index_put_accumulate(start, i, g))
    options = [] if device == "cuda" else ["triton_interpreter"]

    def reference(acc: torch.Tensor, grad: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        start = acc.double() * 2 if acc_kind == "computed" else acc.double()
        return start.index_put((index,), grad.double(), accumulate=True).float()

    fd.execute([acc, grad, index], _enable_options=options)
    bound = fd.fec.bound_program([acc, grad, index], enable_options=options)
    assert bound is not None
    assert any(isinstance(s, ScatterSequence) for s in kernel_segments(fd))
    launcher_runs: list[int] = []
    run = ScatterSequence.run
    monkeypatch.setattr(ScatterSequence, "run", lambda self, *a, **k: launcher_runs.append(1) or run(self, *a, **k))
    results = []
    for _ in range(4):  # the first binds, the second replays the steps, later ones the straight-line function
        args = [torch.randn(5, 3, device=device), torch.randn(6, 3, device=device),
                torch.randint(0, 5, (6,), device=device)]
        (out,) = bound.run(args)
        torch.testing.assert_close(out, reference(*args))
        results.append(out)
    assert not launcher_runs
    assert len({r.data_ptr() for r in results}) == len(results)  # each call's result a tensor of its own
    if device == "cpu":
        with pytest.raises(ValueError, match=r"index_put_accumulate: index T\d+ holds 5, out of range"):
            bound.run([acc, grad, torch.tensor([0, 5, 2, 4, 0, 1])])
    torch.use_deterministic_algorithms(True)
    try:
        args = [torch.randn(5, 3, device=device), torch.randn(6, 3, device=device), index]
        (out,) = bound.run(args)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(out, reference(*args))
    assert launcher_runs  # ATen's sorted index_put, through the launcher's path
