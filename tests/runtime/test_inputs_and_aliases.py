"""Input declarations nvFuser code uses: expanded (stride-0) broadcast inputs through every kind of
op, ``define_tensor(sizes=, strides=)``, contiguity in allocation order with ``stride_order``;
layouts and aliasing: ``fd.ops.stride_order`` and ``add_output(out, alias_input=...)``."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition, compute_tensor_descriptor
from pyfuser.frontend.fusion_definition import EmptyFusionError
from pyfuser.runtime.inputs import InputBinder, check_devices


def expanded(device: str) -> torch.Tensor:
    return torch.randn(1, 5, device=device).expand(4, 5)  # axis 0 expanded: stride 0, extent 4


@pytest.mark.parametrize("op", ["add", "sum_expanded", "sum_other", "matmul", "reshape", "permute", "cat", "slice",
                                "pad", "set"])
def test_expanded_input_through_every_kind_of_op(op: str, device: str) -> None:
    x = expanded(device)
    y = torch.randn(4, 5, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=[None, True])  # as from_pytorch(x) declares it
        u = fd.define_tensor([-1, -1])
        out = {
            "add": lambda: fd.ops.add(t, u),
            "sum_expanded": lambda: fd.ops.sum(t, [0]),
            "sum_other": lambda: fd.ops.sum(t, [1]),
            "matmul": lambda: fd.ops.matmul(t, fd.ops.permute(u, [1, 0])),
            "reshape": lambda: fd.ops.reshape(t, [-1]),
            "permute": lambda: fd.ops.permute(t, [1, 0]),
            "cat": lambda: fd.ops.cat([t, u], 0),
            "slice": lambda: fd.ops.slice(t, [1, 0], [3, 5]),
            "pad": lambda: fd.ops.pad(t, [0, 0, 1, 1]),
            "set": lambda: fd.ops.set(t),
        }[op]()
        fd.add_output(out)
    want = {
        "add": lambda: x + y, "sum_expanded": lambda: x.sum(0), "sum_other": lambda: x.sum(1),
        "matmul": lambda: x @ y.t(), "reshape": lambda: x.reshape(-1), "permute": lambda: x.permute(1, 0),
        "cat": lambda: torch.cat([x, y]), "slice": lambda: x[1:3], "pad": lambda: torch.nn.functional.pad(x, [0, 0, 1, 1]),
        "set": lambda: x.clone(),
    }[op]()
    (got,) = fd.execute([x, y])
    torch.testing.assert_close(got, want)
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), "outputs never alias inputs"


def test_expanded_static_axis_and_bad_strides() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([3, -1], contiguity=[None, True])
        fd.add_output(fd.ops.mul(t, 2))
    x = torch.randn(1, 6).expand(3, 6)
    torch.testing.assert_close(fd.execute([x])[0], x * 2)
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 0: declared expanded \(contiguity None\), so its "
                                         r"stride must be 0 .* got stride 6"):
        fd.execute([x.contiguous()])
    with pytest.raises(ValueError, match=r"input 0 \(T0\) axis 0: expected static size 3, got size 2"):
        fd.execute([torch.randn(1, 6).expand(2, 6)])


def test_contiguity_is_listed_in_allocation_order_with_a_stride_order() -> None:
    """Seed 003's input: axis 1 outermost, the broadcast axis 0 in the middle."""
    x = torch.randn(4, 1, 3).permute(1, 0, 2)  # [1, 4, 3], strides (3, 3, 1)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1, -1], contiguity=[True, None, True], stride_order=[1, 2, 0])
        fd.add_output(fd.ops.exp(t))
    assert t.contiguity == [True, None, True]
    torch.testing.assert_close(fd.execute([x])[0], x.exp())


@pytest.mark.parametrize(("tensor", "contiguity", "stride_order"), [
    (torch.randn(2, 3), [True, True], [1, 0]),
    (torch.randn(3, 2).t(), [True, True], [0, 1]),
    (torch.randn(2, 1, 3), [True, None, True], [2, 1, 0]),
    (torch.randn(1, 3).expand(4, 3), [None, True], [1, 0]),
    (torch.randn(4, 6)[:, ::2], [True, False], [1, 0]),
])
def test_tensor_descriptor_and_the_sizes_strides_form(tensor: torch.Tensor, contiguity: list[bool | None],
                                                      stride_order: list[int]) -> None:
    assert compute_tensor_descriptor(list(tensor.shape), list(tensor.stride())) == (contiguity, stride_order)
    with FusionDefinition() as fd:
        t = fd.define_tensor(sizes=tensor.shape, strides=tensor.stride(), dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t))
    torch.testing.assert_close(fd.execute([tensor])[0], -tensor)
    with FusionDefinition() as static:
        s = static.define_tensor(sizes=tensor.shape, strides=tensor.stride(), static_sizes=True)
        static.add_output(s)
    assert all(i.extent.is_const for i in s.get_logical_domain())


def test_bad_define_tensor_forms() -> None:
    fd = FusionDefinition()
    with pytest.raises(TypeError, match="T0: pass either shape / contiguity / stride_order or sizes / strides"):
        fd.define_tensor([-1], sizes=[2], strides=[1])
    with pytest.raises(TypeError, match="T0: sizes and strides go together"):
        fd.define_tensor(sizes=[2])
    with pytest.raises(ValueError, match=r"T0: 2 sizes \[2, 3\] but 1 strides \[1\]"):
        fd.define_tensor(sizes=[2, 3], strides=[1])
    with pytest.raises(ValueError, match=r"T0: strides must be non-negative ints, got \[-1\]"):
        fd.define_tensor(sizes=[2], strides=[-1])
    with pytest.raises(TypeError, match=r"T0: shape \(or sizes and strides\) is required"):
        fd.define_tensor()
    with pytest.raises(ValueError, match=r"T0: is_cpu=True is for 0-dim scalar tensors"):
        fd.define_tensor([-1], is_cpu=True)


def test_stride_order_op_lays_out_an_output(device: str) -> None:
    x = torch.randn(2, 3, 4, device=device)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.stride_order(fd.ops.exp(t), [0, 1, 2]))  # axis 0 innermost
        fd.add_output(fd.ops.add(fd.ops.stride_order(t, [1, 2, 0]), 1))  # an intermediate layout
    a, b = fd.execute([x])
    torch.testing.assert_close(a, x.exp())
    assert a.stride() == (1, 2, 6)
    torch.testing.assert_close(b, x + 1)
    with fd, pytest.raises(ValueError, match=r"stride_order T0: stride_order \[0, 1\] has 2 entries but the tensor "
                                           r"has rank 3"):
        fd.ops.stride_order(t, [0, 1])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_output_written_in_place_into_an_input(layout: str, device: str) -> None:
    """Thunder's optimizer update: ``param -= lr * grad``, the result written into ``param``."""
    base = torch.randn(6, 8, device=device)
    param = {"contiguous": base, "transposed": base.t(), "sliced": base[:, ::2]}[layout]
    grad = torch.randn(param.shape, device=device)
    before, storage = param.clone(), base.clone()
    with FusionDefinition() as fd:
        p = fd.from_pytorch(param)
        g = fd.from_pytorch(grad)
        updated = fd.ops.sub(p, fd.ops.mul(g, 0.1))
        fd.add_output(updated, alias_input=p)
        fd.add_output(fd.ops.sum(updated))
    (total,) = fd.execute([param, grad])  # the aliased output is not returned
    torch.testing.assert_close(param, before - 0.1 * grad)
    torch.testing.assert_close(total, (before - 0.1 * grad).sum())
    if layout == "sliced":  # only the viewed elements change
        torch.testing.assert_close(base[:, 1::2], storage[:, 1::2])


def test_aliased_output_also_returned_and_bad_aliases() -> None:
    x = torch.randn(3)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        doubled = fd.ops.mul(t, 2)
        fd.add_output(doubled, alias_input=t)
        fd.add_output(doubled)
        with pytest.raises(TypeError, match=r"T2: its dtype double differs from alias_input T0's float"):
            fd.add_output(fd.ops.cast(t, DataType.Double), alias_input=t)
        with pytest.raises(ValueError, match=r"T3: rank 2 differs from alias_input T0's rank 1"):
            fd.add_output(fd.ops.broadcast(t, [True, False]), alias_input=t)
        with pytest.raises(ValueError, match=r"alias_input T1 must be a tensor input of the fusion"):
            fd.add_output(t, alias_input=doubled)
        with pytest.raises(ValueError, match=r"input T0 is already written in place by another output"):
            fd.add_output(fd.ops.neg(t), alias_input=t)
        with pytest.raises(ValueError, match=r"cannot also have a stride_order"):
            fd.add_output(doubled, stride_order=[0], alias_input=t)
    before = x.clone()
    (returned,) = fd.execute([x])
    torch.testing.assert_close(x, before * 2)
    torch.testing.assert_close(returned, before * 2)
    with FusionDefinition() as grows:
        t = grows.define_tensor([-1, 1])
        grows.add_output(grows.ops.expand(grows.ops.sum(t, [1], keepdim=True), [-1, 3]), alias_input=t)
    with pytest.raises(ValueError, match=r"output 0 \(T3\) has shape \(2, 3\) but is written in place into input 0 "
                                         r"\(T0\) of shape \(2, 1\)"):
        grows.execute([torch.randn(2, 1)])


def test_an_empty_fusion_raises_nvfusers_error_type() -> None:
    with FusionDefinition() as fd:
        fd.define_tensor([-1])
    with pytest.raises(NotImplementedError, match="Fusion is empty!"):
        fd.execute([torch.ones(2)])
    with pytest.raises(EmptyFusionError):
        FusionDefinition().execute([])


def test_from_pytorch_of_a_cpu_tensor_when_the_fusion_runs_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvFuser takes CPU tensors only as 0-dim scalars: a definition from a CPU tensor of a fusion run
    on CUDA is reported with nvFuser's message (checked before anything moves to the GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with FusionDefinition() as fd:
        scale = fd.from_pytorch(torch.tensor(2.0))  # a CPU scalar is fine
        fd.add_output(fd.ops.mul(fd.ops.relu(fd.from_pytorch(torch.randn(4, 4))), scale))
    with pytest.raises(ValueError, match=r"T1 was declared by from_pytorch from a tensor on cpu but the fusion runs on "
                                         r"cuda:0: Found unsupported device cpu, only scalar CPU or CUDA tensors are "
                                         r"supported"):
        fd.execute([torch.tensor(2.0), torch.randn(4, 4)], device="cuda:0")
    monkeypatch.undo()
    (out,) = fd.execute([torch.tensor(2.0), torch.ones(4, 4)])  # on the CPU it runs
    torch.testing.assert_close(out, torch.full((4, 4), 2.0))


def test_an_output_of_cpu_scalars_only_in_a_fusion_of_device_tensors_is_an_error() -> None:
    """nvFuser's rule (its issue 2853): an output computed only from 0-dim CPU scalar tensors would be a
    CPU tensor, which a fusion of device tensors does not produce. A creation op (full) makes a device
    tensor, and a fusion of CPU scalars alone runs."""
    scalar, x = torch.tensor(2.0), torch.randn(3, 5)[:, ::2]
    with FusionDefinition() as fd:
        s, t = fd.from_pytorch(scalar), fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t, s))
        fd.add_output(fd.ops.mul(fd.ops.add(s, 3.0), fd.define_scalar(2.0)))
    with pytest.raises(RuntimeError, match=r"output 1 \(T\d+\) is computed only from the CPU scalar tensors T0, so it "
                                           r"would be a CPU tensor of a fusion of device tensors: KernelExecutor does "
                                           r"not support the Fusion provided"):
        fd.execute([scalar, x])
    with FusionDefinition() as fd:
        s, t = fd.from_pytorch(scalar), fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t, s))
        fd.add_output(fd.ops.mul(fd.ops.full([2], 1.0, DataType.Float), s))
        fd.add_output(t)
    added, filled, same = fd.execute([scalar, x])
    torch.testing.assert_close(added, x + 2.0)
    torch.testing.assert_close(filled, torch.full((2,), 2.0))
    assert torch.equal(same, x)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.add(fd.from_pytorch(scalar), 3.0))
    torch.testing.assert_close(fd.execute([scalar])[0], torch.tensor(5.0))


def test_a_fusion_without_tensor_inputs_runs_on_cuda_where_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvFuser's device rule: only scalars and 0-dim CPU tensors as inputs -> the current CUDA device
    (random tensors then meet the caller's CUDA tensors); ``device=`` says otherwise."""
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(fd.ops.full([n], 1.0, DataType.Float), fd.from_pytorch(torch.tensor(2.0))))
    (out,) = fd.execute([3, torch.tensor(2.0)])  # the current CUDA device where there is one, else the CPU
    assert out.device == (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                          else torch.device("cpu"))
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert fd.fec.target_device([3, torch.tensor(2.0)]) == torch.device("cuda", 1)
    assert fd.fec.target_device([3, torch.tensor(2.0)], device="cpu") == torch.device("cpu")
    assert fd.fec.target_device([torch.ones(3)]) == torch.device("cpu")


def test_expanded_inputs_new_ops_and_in_place_outputs_next_to_generated_kernels() -> None:
    """Kernel segments and ATen calls (gcd and index_select have no generated form) in one program."""
    x, acc, idx = torch.randn(1, 6).expand(4, 6), torch.zeros(4, 6), torch.tensor([3, 0, 1])
    before = acc.clone()
    with FusionDefinition() as fd:
        t, a, i = fd.from_pytorch(x), fd.define_tensor([-1, -1]), fd.from_pytorch(idx)
        y = fd.ops.exp(fd.ops.add(t, a))
        fd.add_output(fd.ops.sin(fd.ops.index_select(fd.ops.mul(y, 2.0), i, 0)))
        fd.add_output(fd.ops.gcd(fd.ops.cast(y, DataType.Int), 3))
        fd.add_output(fd.ops.add(a, y), alias_input=a)
    selected, gcd = fd.execute([x, acc, idx], _enable_options=["triton_interpreter"])
    assert fd.last_kernel_code(), "some segments ran as generated kernels"
    want = torch.exp(x + before)
    torch.testing.assert_close(selected, torch.sin((want * 2).index_select(0, idx)))
    torch.testing.assert_close(gcd, torch.gcd(want.long(), torch.tensor(3)))
    torch.testing.assert_close(acc, before + want)


def test_bound_program_runs_what_the_cache_ran(device: str) -> None:
    """``fec.bound_program(args)``: after a run with ``args``, their program with the sizes bound (a
    torch.compile region of static shapes calls it); None before, and for fusions with per-call work
    (scalar inputs, outputs written in place)."""
    x, y = torch.randn(7, 3, device=device)[:, :2], torch.randn(2, device=device)
    with FusionDefinition() as fd:
        t, u = fd.define_tensor([-1, -1]), fd.define_tensor([-1], contiguity=True)
        fd.add_output(fd.ops.sum(fd.ops.mul(t, u), [1]))
    assert fd.fec.bound_program([x, y]) is None
    (want,) = fd.execute([x, y])
    bound = fd.fec.bound_program([x, y])
    assert bound is not None and sorted(bound.env.values()) == [2, 2, 7]  # the three symbolic extents
    (got,) = bound.run([x, y])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, (x * y).sum(1))
    assert fd.fec.bound_program([torch.randn(5, 2, device=device), y]) is None  # never run with these

    with FusionDefinition() as scaled:
        t, s = scaled.define_tensor([-1]), scaled.define_scalar(dtype=DataType.Double)
        scaled.add_output(scaled.ops.mul(t, s))
    scaled.execute([y, 2.0])
    assert scaled.fec.bound_program([y, 2.0]) is None

    with FusionDefinition() as in_place:
        t = in_place.define_tensor([-1])
        in_place.add_output(in_place.ops.add(t, 1.0), alias_input=t)
    z = y.clone()
    in_place.execute([z])
    assert in_place.fec.bound_program([z]) is None


def test_a_cpu_scalar_tensor_beside_tensors_of_another_device(device: str) -> None:
    """torch reads a 0-dim CPU tensor given beside tensors of another device as a scalar: the device
    check accepts it and names it to be moved to the fusion's device (checked on the meta device
    without a GPU); any other tensor on another device is an error naming it."""
    with FusionDefinition() as fd:
        x, s, c = fd.define_tensor([-1]), fd.define_tensor([]), fd.define_tensor([], is_cpu=True)
        fd.add_output(fd.ops.mul(fd.ops.mul(x, s), c))
    specs = InputBinder(fd.fusion.inputs()).specs
    meta = torch.device("meta")
    assert check_devices(specs, [torch.empty(3, device=meta), torch.tensor(2.0), torch.tensor(3.0)], meta) == (1,)
    assert check_devices(specs, [torch.empty(3, device=meta)] * 3, meta) == ()
    with pytest.raises(ValueError, match=r"input 0 \(T0\) is on cpu but the fusion runs on meta"):
        check_devices(specs, [torch.empty(3), torch.tensor(2.0), torch.tensor(3.0)], meta)
    # end to end: on CUDA the scalar moves there (also into a generated kernel); on the CPU nothing moves
    with FusionDefinition() as scaled:
        x, s = scaled.define_tensor([-1]), scaled.define_tensor([])
        scaled.add_output(scaled.ops.mul(x, s))
    x = torch.randn(5, device=device)
    for options in ([], ["triton_interpreter"] if device == "cpu" else []):
        (out,) = scaled.execute([x, torch.tensor(2.0)], _enable_options=options)
        assert out.device == x.device
        torch.testing.assert_close(out, x * 2.0)


@pytest.mark.parametrize("kernels", [False, True], ids=["aten", "kernels"])
def test_outputs_do_not_require_grad(kernels: bool) -> None:
    """Execution is not recorded by autograd, whichever path computes an output (a generated kernel,
    an ATen op, a view of an input): no output requires grad, as torch's outputs under no_grad, and
    an output written in place into a leaf that requires grad is written (as an update under
    no_grad is)."""
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3)
    with FusionDefinition() as fd:
        x, y = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.add(fd.ops.sum(x, [1]), 1.0))
        fd.add_output(fd.ops.mul(x, y))
        fd.add_output(fd.ops.reshape(x, [6]))
        fd.add_output(fd.ops.matmul(x, fd.ops.permute(y, [1, 0])))
    outputs = fd.execute([a, b], _enable_options=["triton_interpreter"] if kernels else [])
    if kernels:
        assert fd.last_kernel_code()
    assert [o.requires_grad for o in outputs] == [False] * 4
    with torch.no_grad():
        want = [a.sum(1) + 1.0, a * b, a.reshape(6), a @ b.T]
    for got, ref in zip(outputs, want, strict=True):
        torch.testing.assert_close(got, ref)

    with FusionDefinition() as step:
        p, g = step.from_pytorch(a), step.from_pytorch(b)
        step.add_output(step.ops.sub(p, step.ops.mul(g, 0.5)), alias_input=p)
    before = a.detach().clone()
    assert step.execute([a, b], _enable_options=["triton_interpreter"] if kernels else []) == []
    torch.testing.assert_close(a.detach(), before - 0.5 * b)
    assert a.requires_grad and a.is_leaf
