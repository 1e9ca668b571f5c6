"""nvFuser's Python API as its own tests use it (issue 34): argument forms, dtypes and values that
nvFuser scripts rely on, each checked against torch on CPU (ATen evaluation and generated kernels)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import pyfuser
from pyfuser import DataType, FusionDefinition, SchedulerType
from pyfuser.multidevice import MultiDeviceExecutorParams
from pyfuser.nvfuser_direct_version import Version
from pyfuser.pytorch_utils import python_scalar_to_nvfuser_dtype, torch_dtype_to_nvfuser_dtype


def run_both(fd: FusionDefinition, inputs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The outputs by ATen evaluation and by generated kernels (Triton's interpreter)."""
    return [fd.execute(inputs), fd.execute(inputs, _enable_options=["triton_interpreter"])]


# --- the import alias ------------------------------------------------------------------------------
ALIAS_SCRIPT = """
import sys
import pyfuser.nvfuser_direct_alias
import nvfuser_direct
from nvfuser_direct import FusionDefinition, schedule
import nvfuser_direct.multidevice as md
import pyfuser
assert nvfuser_direct is pyfuser and FusionDefinition is pyfuser.FusionDefinition
assert md is pyfuser.multidevice and md.__spec__.name == "pyfuser.multidevice"
assert schedule is pyfuser.schedule
from nvfuser_direct.pytorch_utils import torch_dtype_to_nvfuser_dtype
assert sys.modules["nvfuser_direct.pytorch_utils"] is pyfuser.pytorch_utils
print("ok")
"""


def test_nvfuser_direct_alias_imports_pyfuser_modules_once() -> None:
    """``import pyfuser.nvfuser_direct_alias``: nvFuser's imports give pyfuser's own module objects."""
    result = subprocess.run([sys.executable, "-c", ALIAS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "ok", result.stderr


def test_alias_leaves_a_real_nvfuser_alone(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """An importable ``nvfuser_direct`` (a real nvFuser) is never shadowed."""
    real = tmp_path / "nvfuser_direct"  # type: ignore[operator]
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    script = ("import pyfuser\nassert pyfuser.install_nvfuser_alias() is False\nimport nvfuser_direct\n"
              "assert nvfuser_direct.REAL\nprint('ok')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.stdout.strip() == "ok", result.stderr


# --- fusion definition --------------------------------------------------------------------------
def test_add_output_second_positional_is_the_alias_input() -> None:
    x = torch.randn(3, 5)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        doubled = fd.ops.mul(tx, 2.0)
        fd.add_output(doubled, tx)  # nvFuser: fd.add_output(output, alias_input)
        fd.add_output(fd.ops.add(tx, 1.0))
    inp = x.clone()
    (out,) = fd.execute([inp])
    torch.testing.assert_close(inp, x * 2)
    torch.testing.assert_close(out, x + 1)


def test_add_output_positional_stride_order_still_works() -> None:
    x = torch.randn(4, 6)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)), [0, 1])
    (out,) = fd.execute([x])
    assert out.stride() == (1, 4)
    torch.testing.assert_close(out, x.exp())


def test_tensor_dtype_and_is_tensor_called_as_nvfuser_methods() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.BFloat16)
        s = fd.define_scalar(1.0)
        assert t.dtype() is DataType.BFloat16 and t.dtype is DataType.BFloat16
        assert t.is_tensor() is True and s.is_tensor() is False and t.is_tensor and not s.is_tensor
        assert fd.ops.nextafter(s, s).is_tensor() is False


def test_schedule_and_scheduler_type_entries() -> None:
    entries = SchedulerType.__entries  # type: ignore[attr-defined]
    assert [member for member, _ in entries.values()] == list(SchedulerType)
    assert pyfuser.schedule.find_compatible_schedulers is not None


def test_tensor_view_root_domain() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 8])
        r = fd.ops.reshape(t, [32])
        assert not t.has_root() and not r.has_root()
        assert r.get_root_domain() == r.get_logical_domain()


def test_version_compares_with_version_objects() -> None:
    assert pyfuser.version() > Version("0.0.0") and pyfuser.version() > "0.0.0"


def test_pytorch_utils_dtype_translation() -> None:
    assert torch_dtype_to_nvfuser_dtype(torch.float8_e4m3fn) is DataType.Float8_e4m3fn
    assert torch_dtype_to_nvfuser_dtype(float) is DataType.Double
    assert python_scalar_to_nvfuser_dtype(True) is DataType.Bool
    with pytest.raises(TypeError, match="has no pyfuser DataType"):
        torch_dtype_to_nvfuser_dtype(torch.uint16)


def test_multidevice_executor_params_take_nvfuser_knobs() -> None:
    params = MultiDeviceExecutorParams()
    params.use_allocation_cache = True
    params.offset_stream_indexing_by_rank = True
    params.number_of_streams = 2
    params.inter_stream_synchronization = True
    with pytest.raises(AttributeError):
        params.use_allocation_cashe = True  # type: ignore[attr-defined]


# --- ops -------------------------------------------------------------------------------------------
def test_cat_manual_padding() -> None:
    a, b, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 2)
    with FusionDefinition() as fd:
        ta, tb, tc = (fd.from_pytorch(t) for t in (a, b, c))
        wa, wb, wc = (fd.ops.size(t, 1) for t in (ta, tb, tc))
        pa = fd.ops.pad(ta, [0, fd.ops.add(wb, wc)])
        pb = fd.ops.pad(tb, [wa, wc])
        pc = fd.ops.pad(tc, [fd.ops.add(wa, wb), 0])
        fd.add_output(fd.ops.cat([pa, pb, pc], dim=-1, manual_padding=True))
        fd.add_output(fd.ops.cat([ta, tb], dim=1, manual_padding=False))
    for out in run_both(fd, [a, b, c]):
        torch.testing.assert_close(out[0], torch.cat([a, b, c], 1))
        torch.testing.assert_close(out[1], torch.cat([a, b], 1))


def test_cat_manual_padding_checks_the_pieces() -> None:
    a, b = torch.randn(3, 4), torch.randn(3, 5)
    with FusionDefinition() as fd:
        ta, tb = fd.from_pytorch(a, static_sizes=True), fd.from_pytorch(b, static_sizes=True)
        with pytest.raises(ValueError, match=r"input 0 \(T0\) is defined by nothing"):
            fd.ops.cat([ta, tb], dim=1, manual_padding=True)
        pa, pb = fd.ops.pad(ta, [0, 5]), fd.ops.pad(tb, [3, 0])
        with pytest.raises(ValueError, match="padded by 3 before it on axis 1; the pieces before it span 4"):
            fd.ops.cat([pa, pb], dim=1, manual_padding=True)
        with pytest.raises(ValueError, match="padded on axis 0"):
            fd.ops.cat([fd.ops.pad(ta, [0, 5, 1, 0]), fd.ops.pad(tb, [4, 0])], dim=1, manual_padding=True)


def test_squeeze_expanded() -> None:
    x = torch.randn(3, 1, 5).expand(3, 4, 5)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        with pytest.raises(ValueError, match=r"T0 axis 1 is an expanded broadcast.*squeeze_expanded=True"):
            fd.ops.squeeze(t, [1])
        fd.add_output(fd.ops.exp(fd.ops.squeeze(t, dims=[1], squeeze_expanded=True)))
    for (out,) in run_both(fd, [x]):
        torch.testing.assert_close(out, x[:, 0].exp())
    assert "squeeze_expanded=True" in repr(fd)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("wide", [torch.float32, torch.bfloat16, torch.float64])
def test_float8_storage_and_casts(fp8: torch.dtype, wide: torch.dtype) -> None:
    x = (torch.randn(5, 7) * 4).to(wide)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        narrow = fd.ops.cast(t, torch_dtype_to_nvfuser_dtype(fp8))
        fd.add_output(narrow)
        fd.add_output(fd.ops.cast(narrow, DataType.from_torch(wide)))
    for narrow_out, back in run_both(fd, [x]):
        assert narrow_out.dtype == fp8
        assert torch.equal(narrow_out.float(), x.to(fp8).float())
        assert torch.equal(back, x.to(fp8).to(wide))
    assert f"DataType.{DataType.from_torch(fp8).name}" in repr(fd)


def test_float8_input() -> None:
    x = torch.randn(4, 6).to(torch.float8_e4m3fn)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        assert t.dtype is DataType.Float8_e4m3fn
        fd.add_output(fd.ops.mul(fd.ops.cast(t, DataType.Float), 2.0))
    for (out,) in run_both(fd, [x]):
        torch.testing.assert_close(out, x.float() * 2)


def test_reductions_take_nvfuser_argument_forms() -> None:
    """``prod(arg, dtype)``, ``prod(arg, dim, keepdim, dtype)``, ``sum(arg, dim=d)``."""
    x = torch.rand(2, 4, 8) + 0.5
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.prod(t, DataType.Double))
        fd.add_output(fd.ops.prod(t, 1, True, DataType.Float))
        fd.add_output(fd.ops.prod(t, [-1], False, DataType.Float))
        fd.add_output(fd.ops.sum(t, dim=-1))
        fd.add_output(fd.ops.max(t, dim=0, keepdim=True))
        with pytest.raises(TypeError, match="two dtypes"):
            fd.ops.sum(t, DataType.Float, dtype=DataType.Double)
        with pytest.raises(TypeError, match="dims or dim, not both"):
            fd.ops.sum(t, [0], dim=1)
    expected = [x.double().prod(), x.prod(1, keepdim=True), x.prod(-1), x.sum(-1), x.amax(0, keepdim=True)]
    for outs in run_both(fd, [x]):
        for out, ref in zip(outs, expected, strict=True):
            assert out.dtype == ref.dtype
            torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select_with_a_0_dim_index(dim: int) -> None:
    x, index = torch.randn(8, 6)[:, ::2], torch.tensor(2)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(index), dim))
    for (out,) in run_both(fd, [x, index]):
        assert torch.equal(out, torch.index_select(x, dim, index))


def test_where_of_scalars_has_the_scalars_dtype() -> None:
    """nvFuser's ``where``: two scalar branches give their promoted dtype (torch would give float32)."""
    cond = torch.tensor([True, False, True])
    cases = [((3.0, None), torch.float64), ((3.0, DataType.Float), torch.float32), ((3, DataType.Int32), torch.int32),
             ((3, None), torch.int64), ((3 + 1j, DataType.ComplexFloat), torch.complex64),
             ((True, DataType.Bool), torch.bool)]
    with FusionDefinition() as fd:
        c = fd.from_pytorch(cond)
        for (value, dtype), _ in cases:
            fd.add_output(fd.ops.where(c, fd.define_scalar(value, dtype), fd.define_scalar(value * 0, dtype)))
        fd.add_output(fd.ops.where(c, 1.0, 0.0))  # Python numbers are Double scalars, as in nvFuser
        y = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.where(c, y, fd.define_scalar(1.0)))  # a tensor branch: torch's promotion
    ys = torch.randn(3)
    for outs in run_both(fd, [cond, ys]):
        for out, ((value, _), dtype) in zip(outs, cases, strict=False):
            assert out.dtype == dtype
            assert torch.equal(out, torch.where(cond, torch.tensor(value, dtype=dtype), torch.tensor(value * 0, dtype=dtype)))
        assert outs[-2].dtype == torch.float64 and outs[-1].dtype == torch.float32
        assert torch.equal(outs[-1], torch.where(cond, ys, 1.0))
    namespace: dict[str, object] = {}
    exec(repr(fd), {"DataType": DataType, "FusionDefinition": FusionDefinition}, namespace)
    with FusionDefinition() as again:
        namespace["nvfuser_fusion"](again)  # type: ignore[operator]
    assert [o.dtype for o in again.execute([cond, ys])] == [o.dtype for o in fd.execute([cond, ys])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expanded_broadcast_gives_way_to_the_axis_it_meets(dtype: torch.dtype) -> None:
    """nvFuser keeps an expanded axis a broadcast: ``broadcast_in_dim`` of a mask to ``[b, n, 3]`` meets a
    ``[b, n, 6]`` tensor in ``where`` (AlphaFold3's triangle update) and takes its extent; two axes
    that are not expanded broadcasts must still agree."""
    mask = torch.rand(5, 2) > 0.5
    z = torch.randn(2, 5, 6, dtype=dtype).transpose(0, 1)  # non-contiguous
    v, y = torch.randn(5, dtype=dtype), torch.randn(1, 2, 6, dtype=dtype)
    dt = DataType.from_torch(dtype)
    with FusionDefinition() as fd:
        m, t = fd.from_pytorch(mask), fd.from_pytorch(z)
        wide = fd.ops.broadcast_in_dim(m, shape=[fd.ops.size(t, 0), fd.ops.size(t, 1), 3], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.where(wide, t, 0.0))
        vv, yy = fd.define_tensor([-1], dtype=dt), fd.define_tensor([1, -1, 6], dtype=dt)
        fd.add_output(fd.ops.mul(fd.ops.broadcast_in_dim(vv, [5, 2, 3], [0]), yy))  # the 2 stays, the 3 gives way
    for where, scaled in run_both(fd, [mask, z, v, y]):
        assert where.shape == (5, 2, 6) and torch.equal(where, torch.where(mask[:, :, None], z, 0.0))
        torch.testing.assert_close(scaled, v[:, None, None] * y)
    with FusionDefinition() as fd:
        y2 = fd.define_tensor([1, -1, 6])
        with pytest.raises(ValueError, match=r"add: incompatible broadcast shapes: T0 axis 2 has extent 6 but T1 axis 2 "
                                             r"has extent 3"):
            fd.ops.add(y2, fd.define_tensor([1, 2, 3]))


def test_matmul_without_expr_eval_fails_as_nvfuser() -> None:
    a, b = torch.randn(24, 8), torch.randn(8, 16)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    torch.testing.assert_close(fd.execute([a, b], _enable_options=["fuse_matmul"])[0], a @ b)
    with pytest.raises(RuntimeError, match="Can not find a scheduler to schedule fusion segment"):
        fd.execute([a, b], _enable_options=["fuse_matmul"], _disable_options=["matmul_expr_eval"])


# --- profiling and set-up ---------------------------------------------------------------------------
def test_python_profiler_records_segments_and_schedulers() -> None:
    x, y = torch.randn(2, 5), torch.randn(2, 5)
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.sum(fd.ops.sum(fd.ops.add(a, b), dim=-1), dim=-1))
    with pyfuser.PythonProfiler() as prof:
        (out,) = fd.execute([x, y], _enable_options=["triton_interpreter"])
    torch.testing.assert_close(out, (x + y).sum())
    profile = prof.profile
    assert profile.fusion_id >= 0 and profile.segments == len(profile.kernel_profiles) == 2
    assert [k.scheduler for k in profile.kernel_profiles] == ["reduction", "reduction"]
    assert all(k.name for k in profile.kernel_profiles) and profile.input_bytes == 80 and profile.host_time_ms > 0
    with pyfuser.PythonProfiler(auto_scheduled=False) as prof:
        fd.manual_execute([x, y])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["user"]
    with pytest.raises(ValueError, match="no fusion was executed"):
        _ = pyfuser.PythonProfiler().profile


NO_TRITON = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "triton":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import torch
from pyfuser import FusionDefinition
x = torch.randn(3, 37)
with FusionDefinition() as fd:
    fd.add_output(fd.ops.sin(fd.from_pytorch(x)))
assert torch.equal(fd.execute([x])[0], x.sin())
try:
    fd.manual_execute([x])
except ModuleNotFoundError as e:
    print(e)
"""


def test_missing_triton_says_how_to_install(tmp_path: object) -> None:
    env = {"PYTHONPATH": ":".join(sys.path), "PYFUSER_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, env=env, timeout=300)
    assert "pip install 'pyfuser[triton]'" in result.stdout, result.stderr


@pytest.mark.parametrize(("sizes", "strides", "contiguity", "stride_order"), [
    ([2, 1, 3, 1, 4, 3], [12, 4, 4, 4, 1, 0], [True, None, True, None, True, None], [5, 4, 3, 2, 1, 0]),
    ([2, 3, 1, 5, 4], [28, 4, 14, 0, 1], [False, None, True, None, True], [4, 2, 3, 1, 0]),
    ([2, 2, 1, 1, 2, 2, 2], [8, 4, 3, 9, 2, 0, 1], [None, True, True, None, True, None, True], [5, 4, 3, 6, 2, 1, 0]),
    ([2, 2, 2, 2], [8, 4, 0, 2], [True, True, None, False], [3, 2, 1, 0]),
])
def test_compute_tensor_descriptor_orders_as_nvfuser(sizes: list[int], strides: list[int],
                                                     contiguity: list[bool | None], stride_order: list[int]) -> None:
    """Size-1 axes with odd strides sort by stride; stride-0 axes keep their place. The descriptor
    declares an input that takes the tensor."""
    assert pyfuser.compute_tensor_descriptor(sizes, strides) == (contiguity, stride_order)
    x = torch.randn(1 + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))).as_strided(sizes, strides)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1 if n > 1 else 1 for n in sizes], contiguity=contiguity, stride_order=stride_order)
        fd.add_output(fd.ops.mul(t, 2.0))
    torch.testing.assert_close(fd.execute([x])[0], x * 2)
    with pytest.raises(ValueError, match="negative strides"):
        pyfuser.compute_tensor_descriptor([2], [-1])


def test_sizes_computed_by_scalar_arithmetic_on_the_host() -> None:
    """nvFuser evaluates scalar graphs of constants and input scalars on the host: a float product
    cast to int pads, a chain of signbit / fmod / reciprocal of an input reshapes."""
    x, y = torch.randn(1, 2, 3), torch.randn(192).as_strided((4, 8, 6), (48, 6, 1))
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        width = fd.ops.cast(fd.ops.mul(fd.define_scalar(2.5, DataType.Float), fd.define_scalar(7)), DataType.Int)
        fd.add_output(fd.ops.pad(tx, [width, width, 1, width]))
        rows = fd.define_scalar(None, dtype=DataType.Int)
        ty = fd.from_pytorch(y)
        inexact = fd.ops.cast(fd.ops.ne(fd.ops.fmod(192, rows), 0), DataType.Int)
        cols = fd.ops.sub(fd.ops.mul(192, fd.ops.reciprocal(rows)), inexact)  # a float: 192 / rows
        assert cols.dtype is DataType.Float
        fd.add_output(fd.ops.sum(fd.ops.reshape(ty, [rows, cols]), [1]))
    for padded, summed in run_both(fd, [x, 32, y]):
        assert torch.equal(padded, torch.nn.functional.pad(x, [17, 17, 1, 17]))
        torch.testing.assert_close(summed, y.reshape(32, 6).sum(1))
    namespace: dict[str, object] = {}
    exec(repr(fd), {"DataType": DataType, "FusionDefinition": FusionDefinition}, namespace)
    with FusionDefinition() as again:
        namespace["nvfuser_fusion"](again)  # type: ignore[operator]
    torch.testing.assert_close(again.execute([x, 32, y])[1], y.reshape(32, 6).sum(1))
    with pytest.raises(ValueError, match=r"= 37.4\d* sizes an op but is not a whole number"):
        fd.execute([x, 5, y])


def test_a_tensor_for_a_scalar_input_is_named_not_printed() -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(t, fd.define_scalar()))
    x = torch.rand(15)
    with pytest.raises(TypeError, match=r"^input 1 \(d\d+\): expected a double scalar, got a torch.float32 tensor of "
                                        r"rank 1$"):
        fd.execute([x, x])


def test_never_defined_and_empty_definitions_get_nvfusers_two_errors() -> None:
    """A definition never written is nvFuser's "Fusion does not exist!" (a forgotten ``with``);
    one written without outputs is "Fusion is empty!"."""
    x = torch.randn(4, 4)
    with pytest.raises(NotImplementedError, match="Fusion does not exist! Use `with FusionDefinition"):
        FusionDefinition().execute([x])
    with FusionDefinition() as fd:
        pass
    with pytest.raises(NotImplementedError, match="Fusion is empty!"):
        fd.execute([x])
    with FusionDefinition() as fd:
        fd.define_tensor([-1, -1])
    with pytest.raises(NotImplementedError, match="Fusion is empty!"):
        fd.manual_execute([x])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_of_a_value_written_into_an_input_are_that_input(dtype: torch.dtype) -> None:
    """``add_output(y, x)`` writes ``y`` into ``x``: returning ``y`` (or ``x``) again gives ``x`` itself,
    holding ``y``, as nvFuser's; other outputs keep their own memory."""
    x = torch.randn(3, 6, dtype=dtype)[:, ::2]  # non-contiguous
    expected = torch.relu(x.float()).to(dtype)
    doubled = (x.float() * 2).to(dtype)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.relu(t0)
        t2 = fd.ops.mul(t0, 2.0)
        fd.add_output(t1)
        fd.add_output(t1, t0)
        fd.add_output(t2)
        fd.add_output(t0)
    outs = fd.execute([x], _enable_options=["triton_interpreter"])
    assert len(outs) == 3
    assert outs[0] is x and outs[2] is x
    torch.testing.assert_close(x, expected)
    assert outs[1].data_ptr() != x.data_ptr()
    torch.testing.assert_close(outs[1], doubled)


def test_repro_scripts_speak_the_name_pyfuser_was_imported_by(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the alias, a repro script imports ``nvfuser_direct`` (as nvFuser's do) behind the alias line,
    and still runs; ``last_repro_script`` without saved inputs is nvFuser's AssertionError."""
    x = torch.randn(3, 5)[:, 1:]
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.from_pytorch(x), 3.0), [1]))
    assert "from pyfuser import FusionDefinition, DataType" in fd.repro_script_for([x])
    monkeypatch.setitem(sys.modules, "nvfuser_direct", pyfuser)
    with pytest.raises(AssertionError, match="cannot provide a repro because"):
        fd.last_repro_script()
    fd.execute([x], save_repro_inputs=True)
    script = fd.last_repro_script()
    assert "import pyfuser.nvfuser_direct_alias  # nvfuser_direct is pyfuser\nimport torch\n" \
           "from nvfuser_direct import FusionDefinition, DataType\ndef nvfuser_fusion(fd" in script
    namespace: dict[str, object] = {}
    exec(script, namespace)
    rebuilt = namespace["fd"]
    assert isinstance(rebuilt, FusionDefinition) and repr(rebuilt) == repr(fd)


@pytest.mark.parametrize("kernels", [False, True])
def test_disabling_the_resize_scheduler_is_accepted_and_changes_nothing(kernels: bool) -> None:
    """nvFuser's ``_disable_options=["resize_scheduler"]`` (its transformer backward test): pyfuser has no
    resize scheduler, its slices, pads and concatenations run in the schedulers they always do."""
    x = torch.randn(5, 12)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a = fd.ops.slice(t, [0, 0], [5, 6])
        b = fd.ops.pad(fd.ops.slice(t, [0, 7], [5, 12]), [0, 1])
        fd.add_output(fd.ops.exp(fd.ops.cat([a, b], 1)))
    enabled = ["triton_interpreter"] if kernels else []
    (got,) = fd.execute([x], _enable_options=enabled, _disable_options=["resize_scheduler"])
    (plain,) = fd.execute([x], _enable_options=enabled)
    want = torch.exp(torch.cat([x[:, :6], torch.nn.functional.pad(x[:, 7:], [0, 1])], 1))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(plain, want)
