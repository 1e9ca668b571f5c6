"""Printing in nvFuser's format: the seed 003 fusion, ``print_transforms`` and the dumps."""

from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition, ParallelType, TensorView

SEED_003_MATH = """\
%kernel_math {
T1_l_float[iS3{4096}, iS4{4096}]
   = squeeze( T0_g_float[bS0{1}, iS1{4096}, iS2{4096}], flags = {true, false, false} )
T2_l_float[iS5{4096}, rS6{4096}]
   = reduction( T1_l_float[iS3{4096}, iS4{4096}], op = add, initial value = float(0), allreduce = false )
T3_l_float[bS7{1}, iS8{4096}, bS9{1}]
   = broadcast( T2_l_float[iS5{4096}, rS6{4096}], flags = {true, false, true} )
T4_g_float[bS10{1}, iS11{4096}, iS12{4096}]
   = T0_g_float[bS0{1}, iS1{4096}, iS2{4096}]
   + T3_l_float[bS7{1}, iS8{4096}, bS9{1}];
T5_l_float[iS13{4096}, iS14{4096}]
   = squeeze( T4_g_float[bS10{1}, iS11{4096}, iS12{4096}], flags = {true, false, false} )
T6_g_float[rS15{4096}, iS16{4096}]
   = reduction( T5_l_float[iS13{4096}, iS14{4096}], op = add, initial value = float(0), allreduce = false )
""" + "} // %kernel_math \n"  # nvFuser prints a space before the newline

SEED_003_T0 = """\
T0_g_float[bS0{1}, iS1{4096}, iS2{4096}]
 logical domain : (bS0{1}, iS1{4096}, iS2{4096})
 allocation domain : (iS1{4096}, bS0{1}, iS2{4096})
 contiguity: t n t
 loop domain : (bS0{1}, iS1{4096}, iS2{4096})"""


def seed_003(shape: list[int]) -> tuple[FusionDefinition, TensorView]:
    """The seed 003 fusion; T0 is allocated (iS1, bS0, iS2), i.e. axis 1 outermost."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape, contiguity=[True, None, True], stride_order=[1, 2, 0])
        t2 = fd.ops.sum(fd.ops.squeeze(t0, [0]), [1])
        t4 = fd.ops.add(t0, fd.ops.broadcast(t2, [True, False, True]))
        t6 = fd.ops.sum(fd.ops.squeeze(t4, [0]), [0])
        fd.add_output(t4)
        fd.add_output(t6)
    return fd, t0


def test_seed_003_kernel_math_static() -> None:
    fd, _ = seed_003([1, 4096, 4096])
    assert fd.fusion.math_string() == SEED_003_MATH
    header = ("Inputs:\n  T0_g_float[bS0{1}, iS1{4096}, iS2{4096}]\nOutputs:\n"
              "  T4_g_float[bS10{1}, iS11{4096}, iS12{4096}]\n  T6_g_float[rS15{4096}, iS16{4096}]\n\n")
    assert str(fd) == header + SEED_003_MATH


def test_seed_003_kernel_math_symbolic_has_the_same_shape() -> None:
    fd, _ = seed_003([1, -1, -1])
    text = fd.fusion.math_string()
    # Same op lines and flags; extents are symbols bound at execution.
    assert text.replace("{i0}", "{4096}").replace("{i1}", "{4096}") == SEED_003_MATH


def test_seed_003_print_transforms(capsys: pytest.CaptureFixture[str]) -> None:
    _, t0 = seed_003([1, 4096, 4096])
    assert t0.print_transforms() == SEED_003_T0
    assert capsys.readouterr().out == SEED_003_T0 + "\n"


def test_seed_003_executes_with_its_layout() -> None:
    fd, _ = seed_003([1, -1, -1])
    x = torch.randn(5, 1, 6).permute(1, 0, 2)  # sizes [1, 5, 6], axis 1 outermost in memory
    t4, t6 = fd.execute([x])
    ref4 = x + x.squeeze(0).sum(1)[None, :, None]
    torch.testing.assert_close(t4, ref4)
    torch.testing.assert_close(t6, ref4.squeeze(0).sum(0))


def test_print_math_prints_and_returns(capsys: pytest.CaptureFixture[str]) -> None:
    """nvFuser's text: inputs, outputs, then the math and a blank line."""
    fd, _ = seed_003([1, 4096, 4096])
    ins = "".join(f"  {v}\n" for v in fd.fusion.inputs())
    outs = "".join(f"  {v}\n" for v in fd.fusion.outputs())
    expected = f"Inputs:\n{ins}Outputs:\n{outs}\n{SEED_003_MATH}\n"
    assert fd.fusion.print_math() == expected
    assert capsys.readouterr().out == expected


def test_tensor_domain_prints_its_loop_domain() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 4, 8])
        t1 = fd.define_tensor(shape=[-1, 1])
        fd.add_output(fd.ops.add(t0, t0))
    assert str(t0.domain()) == "[iS0{2}, iS1{4}, iS2{8}]"
    t0.split(2, 4)
    assert str(t0.domain()) == "[iS0{2}, iS1{4}, iS8{2}, iS9{4}]"
    assert repr(t1.domain()) == "[iS3{i0}, bS4{1}]"


def symbolic_2d() -> tuple[FusionDefinition, TensorView]:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.relu(t0)
        fd.add_output(t1)
    return fd, t1


def test_outer_split_prints_ceil_div() -> None:
    _, t1 = symbolic_2d()
    t1.outer_split(0, 3)
    assert t1.transforms_string() == (
        "T1_g_float[iS4{3}, iS5{( ceilDiv(i0, 3) )}, iS3{i1}]\n"
        " logical domain : (iS2{i0}, iS3{i1})\n"
        " contiguity: t t\n"
        "  Outer split: iS2{i0} by factor 3 -> iS4{3}, iS5{( ceilDiv(i0, 3) )}\n"
        " loop domain : (iS4{3}, iS5{( ceilDiv(i0, 3) )}, iS3{i1})")


def test_inner_split_merge_reorder_print_the_loop_domain() -> None:
    _, t1 = symbolic_2d()
    t1.split(1, 4)  # [i0, ceilDiv(i1, 4), 4]
    assert [str(i) for i in t1.get_loop_domain()] == ["iS2{i0}", "iS4{( ceilDiv(i1, 4) )}", "iS5{4}"]
    t1.merge(0)  # [i0 * ceilDiv(i1, 4), 4]
    assert str(t1.axis(0)) == "iS6{( i0 * ( ceilDiv(i1, 4) ) )}"
    t1.reorder({0: 1})
    t1.axis(0).parallelize(ParallelType.block_x)
    t1.axis(1).parallelize(ParallelType.grid_x)
    assert t1.transforms_string() == (
        "T1_g_float[ithreadIdx.x5{4}, iblockIdx.x6{( i0 * ( ceilDiv(i1, 4) ) )}]\n"
        " logical domain : (iS2{i0}, iS3{i1})\n"
        " contiguity: t t\n"
        "  Split: iS3{i1} by factor 4 -> iS4{( ceilDiv(i1, 4) )}, ithreadIdx.x5{4}\n"
        "  Merge: iS2{i0} and iS4{( ceilDiv(i1, 4) )} -> iblockIdx.x6{( i0 * ( ceilDiv(i1, 4) ) )}\n"
        " loop domain : (ithreadIdx.x5{4}, iblockIdx.x6{( i0 * ( ceilDiv(i1, 4) ) )})")


def test_seed_003_t7_style_schedule_prints_like_the_seed() -> None:
    """The scheduled cache of seed 003: split by 2, by 132, by 2, with a blockIdx.y axis."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([1, 4096, 4096], contiguity=[True, None, True], stride_order=[1, 2, 0])
        t1 = fd.ops.set(t0)
        fd.add_output(t1)
    t1.split(1, 2).split(1, 132).split(1, 2)
    t1.reorder({3: 0, 1: 1, 2: 2, 4: 3, 0: 4})
    t1.axis(0).parallelize(ParallelType.grid_y)
    t1.set_allocation_domain([t1.get_logical_domain()[i] for i in (1, 0, 2)], [True, None, True])
    assert t1.transforms_string() == (
        "T1_g_float[iblockIdx.y9{132}, iS10{8}, iS11{2}, iS7{2}, bS3{1}, iS5{4096}]\n"
        " logical domain : (bS3{1}, iS4{4096}, iS5{4096})\n"
        " allocation domain : (iS4{4096}, bS3{1}, iS5{4096})\n"
        " contiguity: t n t\n"
        "  Split: iS4{4096} by factor 2 -> iS6{2048}, iS7{2}\n"
        "  Split: iS6{2048} by factor 132 -> iS8{16}, iblockIdx.y9{132}\n"
        "  Split: iS8{16} by factor 2 -> iS10{8}, iS11{2}\n"
        " loop domain : (iblockIdx.y9{132}, iS10{8}, iS11{2}, iS7{2}, bS3{1}, iS5{4096})")


def test_parallel_type_spellings() -> None:
    _, t1 = symbolic_2d()
    t1.split(0, 2)
    t1.axis(0).parallelize(ParallelType.stream)
    t1.axis(1).parallelize(ParallelType.mesh_x)
    t1.axis(2).parallelize(ParallelType.vectorize)
    assert str(t1) == "T1_g_float[iStreamIdx4{( ceilDiv(i0, 2) )}, ideviceIdx.x5{2}, iV3{i1}]"


@pytest.mark.parametrize(("dtype", "spelling"), [
    (DataType.Float, "float"), (DataType.Double, "double"), (DataType.Half, "__half"),
    (DataType.BFloat16, "__bfloat"), (DataType.Int, "int64_t"), (DataType.Int32, "int"), (DataType.Bool, "bool"),
])
def test_tensor_dtype_spelling(dtype: DataType, spelling: str) -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 1], dtype=dtype)
    assert str(t) == f"T0_g_{spelling}[iS0{{i0}}, bS1{{1}}]"


def test_op_lines_print_in_kernel_math_style() -> None:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        s = fd.define_scalar(dtype=DataType.Double)
        t1 = fd.ops.mul(t0, s)
        t2 = fd.ops.neg(t1)
        t3 = fd.ops.exp(t2)
        t4 = fd.ops.where(fd.ops.gt(t3, 1.0), t3, 0.0)
        t5 = fd.ops.cast(t4, DataType.Half)
        fd.add_output(fd.ops.permute(t5, [1, 0]))
    text = fd.fusion.math_string()
    assert "T1_l_float[iS2{i0}, iS3{i1}]\n   = T0_g_float[iS0{i0}, iS1{i1}]\n   * d2;\n" in text
    assert "   = -T1_l_float[iS2{i0}, iS3{i1}];\n" in text
    assert "   = expf(T2_l_float[iS4{i0}, iS5{i1}]);\n" in text, "float math functions take the f suffix"
    assert "   > double(1.0);\n" in text
    assert "   = where(T4_l_bool[iS8{i0}, iS9{i1}]\n     , T3_l_float[iS6{i0}, iS7{i1}]\n     , double(0.0));\n" in text
    assert "   = __float2half(T5_l_float[iS10{i0}, iS11{i1}]);\n" in text
    assert "   = Set.Permute( T6_l___half[iS12{i0}, iS13{i1}], cache_op=Streaming )\n" in text


def test_dump_fusion_ir_math_on_compile(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fd, _ = symbolic_2d()
    monkeypatch.setenv("PYFUSER_DUMP", "fusion_ir_math")
    fd.execute([torch.randn(2, 3)])
    assert "%kernel_math {\nT1_g_float[iS2{i0}, iS3{i1}]\n   = relu(T0_g_float[iS0{i0}, iS1{i1}]);\n" in \
        capsys.readouterr().out
    fd.execute([torch.randn(2, 3)])  # cached: compiled once, dumped once
    assert "%kernel_math" not in capsys.readouterr().out


def test_unknown_dump_name_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    fd, _ = symbolic_2d()
    monkeypatch.setenv("PYFUSER_DUMP", "fusion_irr")
    with pytest.raises(ValueError, match="fusion_irr"):
        fd.execute([torch.randn(2, 3)])


@pytest.mark.parametrize(("build", "spelling"), [
    (lambda fd, t: fd.ops.exp(t), "expf(T0"),
    (lambda fd, t: fd.ops.rsqrt(t), "rsqrtf(T0"),
    (lambda fd, t: fd.ops.abs(t), "abs(T0"),
    (lambda fd, t: fd.ops.reciprocal(t), "reciprocal(T0"),
    (lambda fd, t: fd.ops.sigmoid(t), "sigmoid(T0"),
    (lambda fd, t: fd.ops.exp(fd.ops.cast(t, DataType.Double)), "exp(T1"),
    (lambda fd, t: fd.ops.maximum(t, 0.0), "fmax(T0"),
    (lambda fd, t: fd.ops.minimum(fd.ops.cast(t, DataType.Int), 3), "min(T1"),
    (lambda fd, t: fd.ops.cast(t, DataType.BFloat16), "__float2bfloat(T0"),
    (lambda fd, t: fd.ops.cast(fd.ops.cast(t, DataType.Half), DataType.Float), "__half2float(T1"),
    (lambda fd, t: fd.ops.cast(t, DataType.Double), "__to_double(T0"),
    (lambda fd, t: fd.ops.cast(fd.ops.cast(t, DataType.BFloat16), DataType.Int), "__bfloat2int(T1"),
    (lambda fd, t: fd.ops.cast(fd.ops.cast(t, DataType.Int32), DataType.Half), "__int2half(T1"),
])
def test_pointwise_function_spellings(build: object, spelling: str) -> None:
    """Kernel math spells functions as nvFuser's CUDA runtime does (expf for float exp, fmax, casts)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1])
        fd.add_output(build(fd, t))  # type: ignore[operator]
    assert f"   = {spelling}" in fd.fusion.math_string()
