"""The op families and size tables that ``benchmarks/kernels.py`` sweeps.

Each family is one fusion written twice: as a pyfuser FusionDefinition (``define``) and as the same torch
function (``torch_fn``; eager and torch.compile of it are the anchors). ``make`` builds a point's inputs
from its shape, dtype and layout. The points are data: ``GRIDS`` (shapes per grid), ``DTYPES`` and each
family's layouts give the full sweep, capped by ``MAX_POINT_BYTES``; ``QUICK`` lists a few points per
family; ``Family.tiny`` is the shape of the CPU dry run (Triton's interpreter, correctness only).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.tensor_view import TensorView
from pyfuser.schedule import SchedulerType

#: A point's inputs: tensors, and Python ints for a fusion's scalar inputs (embedding backward's vocabulary).
Tensors = list[Any]

#: Bytes one point may move (inputs read + outputs written): the sweep fits the GPU and its L2 flush.
MAX_POINT_BYTES = 256 << 20

#: (rows, columns) of the 2-D families: columns 64 to 262144 wide (hidden sizes, vocabularies), powers of two and
#: odd sizes; per column a large row count (about 2**25 elements) and a small, odd one (the launch-bound end,
#: one row included). The full sweep runs bf16 on all of them and fp32 and the permuted layouts on the large.
ROWS_COLUMNS_LARGE = ((262144, 64), (131072, 127), (65536, 512), (32768, 1000), (8192, 4096), (2048, 11008),
                      (1024, 32000), (512, 65536), (256, 128256), (128, 262144))
ROWS_COLUMNS_SMALL = ((4097, 64), (1023, 127), (4097, 512), (1023, 1000), (1023, 4096), (255, 11008),
                      (127, 32000), (63, 65536), (33, 128256), (1, 262144))

#: Few rows, each wide (a vocabulary, a long sequence): fewer rows than an H100 or H200 has SMs, so one
#: program per row leaves most idle and the normalizations split each row across programs. The
#: normalization families (softmax, log-softmax, cross-entropy) run these too, in bf16 and fp32.
ROWS_FEW_WIDE = ((8, 262144), (32, 262144), (63, 262144), (130, 131072), (17, 128256), (66, 65536), (127, 32768))

#: Many narrow rows: a channels-last layer norm over a CNN's channels (ConvNeXt's 96-768 at batch 32), the
#: norms' backward families run these too (the inner-outer scheduler's narrow-row steps were chosen on them).
ROWS_MANY_NARROW = ((100352, 96), (25088, 192), (6272, 384), (1568, 768), (65536, 64), (16384, 256), (16384, 512))

#: Shapes per grid name. ``2d``: (rows, columns); ``rotary``: (batch, sequence, heads, head dim);
#: ``batchnorm``: (N, C, H, W); ``embedding``: (tokens, hidden, vocabulary); ``seed003``: (1, rows, columns);
#: ``relative``: (batch x heads, sequence, span).
GRIDS: dict[str, tuple[tuple[int, ...], ...]] = {
    "2d": ROWS_COLUMNS_LARGE + ROWS_COLUMNS_SMALL,
    "rotary": ((1, 4096, 32, 128), (8, 512, 16, 64), (4, 2048, 32, 128), (2, 1023, 12, 64), (1, 127, 8, 128)),
    "batchnorm": ((32, 256, 56, 56), (32, 64, 112, 112), (64, 512, 28, 28), (128, 2048, 7, 7), (3, 127, 33, 33),
                  (256, 64, 32, 32)),
    "embedding": ((4096, 1024, 32000), (8192, 2048, 32000), (4096, 1024, 128256), (16384, 4096, 1000),
                  (1023, 4096, 151936), (65536, 768, 50257), (512, 1024, 32000), (2047, 2048, 50257),
                  (32768, 1024, 1000)),
    "seed003": ((1, 4096, 4096), (1, 1024, 65536), (1, 16384, 1000)),
    # [N, C, L], one channel a group: wav2vec2's feature encoder (8 x 512 x 15999), 1-D audio and image features
    "group_norm": ((8, 512, 15999), (32, 128, 4096), (16, 64, 16384), (4, 256, 3000), (3, 127, 1001)),
    # (batch x heads, sequence, span): DeBERTa-v3's relative attention (256 position buckets, 12 heads) at
    # batch 8 and ~10.7 over 512 tokens, 16 over 256, 2 over 1024, and an odd small one
    "relative": ((96, 512, 256), (128, 512, 256), (192, 256, 256), (24, 1024, 256), (33, 127, 64)),
}

BF, F32 = torch.bfloat16, torch.float32
DTYPES = (BF, F32)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "f32"}


@dataclasses.dataclass(frozen=True)
class Point:
    family: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"

    @property
    def name(self) -> str:
        layout = "" if self.layout == "contiguous" else f"_{self.layout}"
        return f"{self.family}_{DTYPE_NAMES[self.dtype]}_{'x'.join(map(str, self.shape))}{layout}"


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    grid: str
    make: Callable[[Point, str], Tensors]
    define: Callable[[FusionDefinition, Tensors], None]
    torch_fn: Callable[..., Any]
    tiny: tuple[int, ...]
    layouts: tuple[str, ...] = ("contiguous",)
    #: Tensors of the grid shape's size the fusion reads and writes (the byte cap's estimate).
    copies: int = 2
    #: The scheduler ``kernels.py --sweep`` hand-tunes (the fusion's one segment).
    scheduler: SchedulerType = SchedulerType.pointwise
    #: Layouts, dtypes or shapes the family does not run, with the reason (recorded in the results).
    skip: Callable[[Point], str | None] = lambda point: None
    #: Shapes beyond the grid's the family runs in both dtypes (``ROWS_FEW_WIDE`` for normalizations).
    extra: tuple[tuple[int, ...], ...] = ()


# Helpers --------------------------------------------------------------------------------------------------


def _rand(shape: Sequence[int], dtype: torch.dtype, device: str, layout: str = "contiguous") -> torch.Tensor:
    """A random tensor of ``shape``; ``permuted``: the same logical shape over memory with the last two axes
    swapped (a transposed view, as ``x.view(b, s, h, d).transpose(1, 2)`` and ``x.t()`` make)."""
    if layout == "permuted" and len(shape) >= 2:
        order = list(range(len(shape)))
        order[-1], order[-2] = order[-2], order[-1]
        return torch.randn([shape[i] for i in order], dtype=dtype, device=device).permute(order)
    return torch.randn(list(shape), dtype=dtype, device=device)


def _dt(tensor: torch.Tensor) -> DataType:
    return DataType.BFloat16 if tensor.dtype == torch.bfloat16 else DataType.Float


def _f(fd: FusionDefinition, tv: TensorView) -> TensorView:
    return fd.ops.cast(tv, DataType.Float)


def _bcast(fd: FusionDefinition, tv: TensorView, flags: list[bool]) -> TensorView:
    return fd.ops.broadcast(tv, flags)


# Pointwise with broadcasts --------------------------------------------------------------------------------


def _make_bias(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((rows, cols), point.dtype, dev, point.layout), _rand((cols,), point.dtype, dev)]


def _def_bias_row(fd: FusionDefinition, inputs: Tensors) -> None:
    x, b = (fd.from_pytorch(t) for t in inputs)
    y = fd.ops.gelu(fd.ops.add(_f(fd, x), _bcast(fd, _f(fd, b), [True, False])), approximate="tanh")
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_bias_row(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x.float() + b.float(), approximate="tanh").to(x.dtype)


def _make_bias_col(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((rows, cols), point.dtype, dev, point.layout), _rand((rows, 1), torch.float32, dev),
            _rand((cols,), point.dtype, dev)]


def _def_bias_col(fd: FusionDefinition, inputs: Tensors) -> None:
    """A per-row scale (a column vector) and a per-column weight: the two broadcasts of a norm's tail."""
    x, s, w = (fd.from_pytorch(t) for t in inputs)
    y = fd.ops.mul(fd.ops.mul(_f(fd, x), s), _bcast(fd, _f(fd, w), [True, False]))
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_bias_col(x: torch.Tensor, s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() * s * w.float()).to(x.dtype)


def _make_mask3d(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((4, rows, cols), point.dtype, dev, point.layout), _rand((1, rows, cols), point.dtype, dev)]


def _def_mask3d(fd: FusionDefinition, inputs: Tensors) -> None:
    """Attention scores scaled plus an additive mask shared by the batch (a broadcast leading axis)."""
    x, m = (fd.from_pytorch(t) for t in inputs)
    fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(_f(fd, x), 0.125), _f(fd, m)), _dt(inputs[0])))


def _torch_mask3d(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x.float() * 0.125 + m.float()).to(x.dtype)


def _make_mask4d(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((2, 2, rows, cols), point.dtype, dev, point.layout),
            torch.rand(2, 1, 1, cols, device=dev) > 0.2]


def _def_mask4d(fd: FusionDefinition, inputs: Tensors) -> None:
    """A [batch, heads, queries, keys] score tensor under a boolean padding mask [batch, 1, 1, keys]."""
    x, m = (fd.from_pytorch(t) for t in inputs)
    fd.add_output(fd.ops.cast(fd.ops.where(m, _f(fd, x), -1e4), _dt(inputs[0])))


def _torch_mask4d(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(m, x.float(), -1e4).to(x.dtype)


# Transposes -----------------------------------------------------------------------------------------------


def _make_transpose(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((cols, rows), point.dtype, dev), _rand((rows, cols), point.dtype, dev)]


def _def_transpose_in(fd: FusionDefinition, inputs: Tensors) -> None:
    a, b = (fd.from_pytorch(t) for t in inputs)
    fd.add_output(fd.ops.cast(fd.ops.add(_f(fd, fd.ops.permute(a, [1, 0])), _f(fd, b)), _dt(inputs[0])))


def _torch_transpose_in(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.t().float() + b.float()).to(a.dtype)


def _make_heads(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((rows, 4, cols), point.dtype, dev)]


def _def_heads_out(fd: FusionDefinition, inputs: Tensors) -> None:
    """[tokens, heads, dim] -> [heads, tokens, dim] written contiguous (the output is the permuted one)."""
    x = fd.from_pytorch(inputs[0])
    fd.add_output(fd.ops.cast(fd.ops.mul(_f(fd, fd.ops.permute(x, [1, 0, 2])), 2.0), _dt(inputs[0])))


def _torch_heads_out(x: torch.Tensor) -> torch.Tensor:
    return (x.permute(1, 0, 2).float() * 2.0).to(x.dtype).contiguous()


# Reductions -----------------------------------------------------------------------------------------------


def _make_2d(point: Point, dev: str) -> Tensors:
    return [_rand(point.shape, point.dtype, dev, point.layout)]


def _reduction(op: str, axis: int) -> tuple[Callable[[FusionDefinition, Tensors], None], Callable[..., Any]]:
    """``op`` (sum, amax, mean) over ``axis`` in fp32: the fusion and the torch function."""
    def define(fd: FusionDefinition, inputs: Tensors) -> None:
        x = _f(fd, fd.from_pytorch(inputs[0]))
        fd.add_output({"sum": fd.ops.sum, "amax": fd.ops.max, "mean": fd.ops.mean}[op](x, [axis]))

    def torch_fn(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return {"sum": xf.sum, "amax": xf.amax, "mean": xf.mean}[op](axis)

    return define, torch_fn


# Norms ----------------------------------------------------------------------------------------------------


def _make_layernorm(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((rows, cols), point.dtype, dev), _rand((cols,), point.dtype, dev), _rand((cols,), point.dtype, dev)]


def _def_layernorm(fd: FusionDefinition, inputs: Tensors) -> None:
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    xf = _f(fd, x)
    var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
    y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
    y = fd.ops.add(fd.ops.mul(y, _bcast(fd, _f(fd, w), [True, False])), _bcast(fd, _f(fd, b), [True, False]))
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _make_rmsnorm(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    return [_rand((rows, cols), point.dtype, dev), _rand((cols,), point.dtype, dev)]


def _def_rmsnorm(fd: FusionDefinition, inputs: Tensors) -> None:
    x, w = (fd.from_pytorch(t) for t in inputs)
    xf = _f(fd, x)
    ms = fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True)
    y = fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(ms, 1e-6))), _bcast(fd, _f(fd, w), [True, False]))
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The Llama / Hugging Face RMSNorm: fp32 math, cast back to the input's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


def _make_group_norm(point: Point, dev: str) -> Tensors:
    _, channels, _ = point.shape
    return [_rand(point.shape, point.dtype, dev), _rand((channels,), point.dtype, dev),
            _rand((channels,), point.dtype, dev)]


def _def_group_norm(fd: FusionDefinition, inputs: Tensors) -> None:
    """GroupNorm of one channel a group as ATen's decomposition writes it: the statistics of a
    ``[N, C, 1, L]`` view, the normalized rows squeezed back to ``[N, C, L]``, then the affine."""
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    rows = fd.ops.broadcast(_f(fd, x), [False, False, True, False])
    var, mean = fd.ops.var_mean(rows, [2, 3], correction=0, keepdim=True)
    y = fd.ops.squeeze(fd.ops.mul(fd.ops.sub(rows, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))), [2])
    per_channel = [True, False, True]
    y = fd.ops.add(fd.ops.mul(y, _bcast(fd, _f(fd, w), per_channel)), _bcast(fd, _f(fd, b), per_channel))
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_group_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.group_norm(x, x.shape[1], w, b, 1e-5)


def _make_layernorm_bwd(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    x, dy = _rand((rows, cols), point.dtype, dev), _rand((rows, cols), point.dtype, dev)
    var, mean = torch.var_mean(x.float(), -1, correction=0, keepdim=True)  # the statistics forward saves
    return [dy, x, mean, torch.rsqrt(var + 1e-5), _rand((cols,), point.dtype, dev)]


def _def_layernorm_bwd(fd: FusionDefinition, inputs: Tensors) -> None:
    dy, x, mean, rstd, w = (fd.from_pytorch(t) for t in inputs)
    dyf, xf, wf = (_f(fd, t) for t in (dy, x, w))
    n = float(inputs[1].shape[1])
    xhat = fd.ops.mul(fd.ops.sub(xf, mean), rstd)
    g = fd.ops.mul(dyf, _bcast(fd, wf, [True, False]))
    a = fd.ops.sum(g, [1], keepdim=True)
    c = fd.ops.sum(fd.ops.mul(g, xhat), [1], keepdim=True)
    dx = fd.ops.mul(rstd, fd.ops.sub(fd.ops.sub(g, fd.ops.div(a, n)), fd.ops.mul(xhat, fd.ops.div(c, n))))
    dt = _dt(inputs[0])
    fd.add_output(fd.ops.cast(dx, dt))
    fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), dt))
    fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), dt))


def _torch_layernorm_bwd(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                         w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """ATen's fused backward (what autograd runs for ``F.layer_norm``). Its CPU kernel takes the statistics
    in the input's dtype, its CUDA kernel in fp32 (as the forward saves them there)."""
    if x.device.type == "cpu":
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return tuple(torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[1]], mean, rstd, w, w,
                                                           [True, True, True]))


def _make_rmsnorm_bwd(point: Point, dev: str) -> Tensors:
    rows, cols = point.shape
    x, dy = _rand((rows, cols), point.dtype, dev), _rand((rows, cols), point.dtype, dev)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return [dy, x, rstd, _rand((cols,), point.dtype, dev)]


def _def_rmsnorm_bwd(fd: FusionDefinition, inputs: Tensors) -> None:
    dy, x, rstd, w = (fd.from_pytorch(t) for t in inputs)
    dyf, xf, wf = (_f(fd, t) for t in (dy, x, w))
    n = float(inputs[1].shape[1])
    g = fd.ops.mul(dyf, _bcast(fd, wf, [True, False]))
    c = fd.ops.sum(fd.ops.mul(g, xf), [1], keepdim=True)
    r3 = fd.ops.mul(fd.ops.mul(rstd, rstd), rstd)
    dx = fd.ops.sub(fd.ops.mul(g, rstd), fd.ops.mul(xf, fd.ops.mul(r3, fd.ops.div(c, n))))
    dt = _dt(inputs[0])
    fd.add_output(fd.ops.cast(dx, dt))
    fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, fd.ops.mul(xf, rstd)), [0]), dt))


def _torch_rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                       w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    dyf, xf, wf = dy.float(), x.float(), w.float()
    g = dyf * wf
    c = (g * xf).sum(1, keepdim=True)
    dx = g * rstd - xf * (rstd ** 3) * c / x.shape[1]
    return dx.to(dy.dtype), (dyf * xf * rstd).sum(0).to(dy.dtype)


# Softmax and cross-entropy --------------------------------------------------------------------------------


def _def_softmax(fd: FusionDefinition, inputs: Tensors) -> None:
    x = _f(fd, fd.from_pytorch(inputs[0]))
    e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
    fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), _dt(inputs[0])))


def _torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _def_log_softmax(fd: FusionDefinition, inputs: Tensors) -> None:
    x = _f(fd, fd.from_pytorch(inputs[0]))
    shifted = fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True))
    lse = fd.ops.log(fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True))
    fd.add_output(fd.ops.cast(fd.ops.sub(shifted, lse), _dt(inputs[0])))


def _torch_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


def _make_cross_entropy(point: Point, dev: str) -> Tensors:
    rows, vocab = point.shape
    return [_rand((rows, vocab), point.dtype, dev), torch.randint(0, vocab, (rows,), device=dev)]


def _lse_and_target(fd: FusionDefinition, inputs: Tensors) -> tuple[TensorView, TensorView, TensorView]:
    """fp32 logits, their log-sum-exp per row [rows, 1] and the target's one-hot mask [rows, vocab]."""
    logits, target = (fd.from_pytorch(t) for t in inputs)
    x = _f(fd, logits)
    m = fd.ops.max(x, [1], keepdim=True)
    lse = fd.ops.add(fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(x, m)), [1], keepdim=True)), m)
    columns = _bcast(fd, fd.ops.iota(inputs[0].shape[1], 0, 1, DataType.Int), [True, False])
    hot = fd.ops.eq(columns, _bcast(fd, target, [False, True]))
    return x, lse, hot


def _def_cross_entropy_fwd(fd: FusionDefinition, inputs: Tensors) -> None:
    """Mean negative log-likelihood of the target over vocabulary-wide rows (fp32 math on the logits)."""
    x, lse, hot = _lse_and_target(fd, inputs)
    picked = fd.ops.sum(fd.ops.where(hot, x, 0.0), [1], keepdim=True)
    fd.add_output(fd.ops.mean(fd.ops.sub(lse, picked)))


def _torch_cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """As Hugging Face models compute the loss: logits upcast to fp32, then ``F.cross_entropy``."""
    return F.cross_entropy(logits.float(), target)


def _def_cross_entropy_bwd(fd: FusionDefinition, inputs: Tensors) -> None:
    """d(mean loss)/d(logits) = (softmax - one-hot) / rows, recomputing the softmax from the logits."""
    x, lse, hot = _lse_and_target(fd, inputs)
    p = fd.ops.exp(fd.ops.sub(x, lse))
    grad = fd.ops.div(fd.ops.sub(p, fd.ops.cast(hot, DataType.Float)), float(inputs[0].shape[0]))
    fd.add_output(fd.ops.cast(grad, _dt(inputs[0])))


def _torch_cross_entropy_bwd(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits.float(), -1)
    hot = torch.arange(logits.shape[1], device=logits.device)[None, :] == target[:, None]
    return ((p - hot.float()) / logits.shape[0]).to(logits.dtype)


# Rotary embedding -----------------------------------------------------------------------------------------


def _make_rotary(point: Point, dev: str) -> Tensors:
    """q [b, h, s, d] and k [b, h/4, s, d] (grouped KV heads), contiguous or as the transposed views of
    [b, s, h, d] that attention code makes; cos and sin [s, d] in fp32."""
    b, s, h, d = point.shape
    def heads(n: int) -> torch.Tensor:
        if point.layout == "permuted":
            return torch.randn(b, s, n, d, dtype=point.dtype, device=dev).transpose(1, 2)
        return torch.randn(b, n, s, d, dtype=point.dtype, device=dev)
    angle = torch.arange(s, device=dev, dtype=torch.float32)[:, None] * torch.rand(d, device=dev)[None, :]
    return [heads(h), heads(max(1, h // 4)), angle.cos(), angle.sin()]


def _def_rotary(fd: FusionDefinition, inputs: Tensors) -> None:
    q, k, cos, sin = (fd.from_pytorch(t) for t in inputs)
    d = inputs[0].shape[-1]
    cb, sb = (_bcast(fd, t, [True, True, False, False]) for t in (cos, sin))
    for tv, t in ((q, inputs[0]), (k, inputs[1])):
        xf = _f(fd, tv)
        b, h, s, _ = t.shape
        x1 = fd.ops.slice(xf, [0, 0, 0, 0], [b, h, s, d // 2])
        x2 = fd.ops.slice(xf, [0, 0, 0, d // 2], [b, h, s, d])
        rotated = fd.ops.cat([fd.ops.neg(x2), x1], 3)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(xf, cb), fd.ops.mul(rotated, sb)), _dt(t)))


def _torch_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's ``apply_rotary_pos_emb`` (rotate_half) in fp32, cast back."""
    def rope(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = x.shape[-1] // 2
        rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)
    return rope(q), rope(k)


# DeBERTa's relative-position attention scores ---------------------------------------------------------------


def _make_relative(point: Point, dev: str) -> Tensors:
    """Content scores [B*H, S, S], the content-to-position and position-to-content products [B*H, S, 2 * span]
    (``bmm(q, pos_k^T)``, ``bmm(k, pos_q^T)``), the relative positions ``i - j`` [S, S] and a mask [S, S]."""
    bh, s, span = point.shape
    rel = torch.arange(s, device=dev)[:, None] - torch.arange(s, device=dev)[None, :]
    return [_rand((bh, s, s), point.dtype, dev), _rand((bh, s, 2 * span), point.dtype, dev),
            _rand((bh, s, 2 * span), point.dtype, dev), rel, torch.rand(s, s, device=dev) > 0.9]


def _def_relative_softmax(fd: FusionDefinition, inputs: Tensors) -> None:
    """``softmax(masked_fill(scores + (c2p + p2c^T) / scale, mask, min))`` with ``c2p = gather(c2p_pos, -1,
    clamp(rel + span, 0, 2 span - 1))`` and ``p2c`` at ``-rel``, as Hugging Face's DeBERTa-v2 computes them
    (``DisentangledSelfAttention.disentangled_attention_bias``), in fp32, cast back."""
    scores, c2p, p2c, rel, mask = (fd.from_pytorch(t) for t in inputs)
    bh, s, width = inputs[1].shape
    span = width // 2

    def at(positions: TensorView) -> TensorView:
        index = fd.ops.clamp(fd.ops.add(positions, span), 0, 2 * span - 1)
        return fd.ops.expand(_bcast(fd, index, [True, False, False]), [bh, s, s])

    c2p_att = fd.ops.take_along_axis(c2p, at(rel), 2)
    p2c_att = fd.ops.permute(fd.ops.take_along_axis(p2c, at(fd.ops.neg(rel)), 2), [0, 2, 1])
    y = fd.ops.add(_f(fd, scores), fd.ops.div(fd.ops.add(_f(fd, c2p_att), _f(fd, p2c_att)), 3.0))
    y = fd.ops.where(_bcast(fd, mask, [True, False, False]), torch.finfo(torch.float32).min, y)
    m = fd.ops.max(y, [2], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(y, m))
    fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [2], keepdim=True)), _dt(inputs[0])))


def _torch_relative_softmax(scores: torch.Tensor, c2p: torch.Tensor, p2c: torch.Tensor, rel: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    span = c2p.shape[-1] // 2
    c2p_att = torch.gather(c2p, -1, torch.clamp(rel + span, 0, 2 * span - 1).expand(scores.shape))
    p2c_att = torch.gather(p2c, -1, torch.clamp(-rel + span, 0, 2 * span - 1).expand(scores.shape)).transpose(-1, -2)
    y = scores.float() + (c2p_att.float() + p2c_att.float()) / 3.0
    return torch.softmax(y.masked_fill(mask, torch.finfo(torch.float32).min), -1).to(scores.dtype)


# Batch norm -----------------------------------------------------------------------------------------------


def _make_batchnorm(point: Point, dev: str) -> Tensors:
    n, c, h, w = point.shape
    x = torch.randn(n, c, h, w, dtype=point.dtype, device=dev)
    if point.layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return [x]


def _def_batchnorm_stats(fd: FusionDefinition, inputs: Tensors) -> None:
    """Training statistics of NCHW activations: mean and biased variance per channel, in fp32."""
    var, mean = fd.ops.var_mean(_f(fd, fd.from_pytorch(inputs[0])), [0, 2, 3], correction=0)
    fd.add_output(mean)
    fd.add_output(var)


def _torch_batchnorm_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    return mean, var


def _make_batchnorm_fwd(point: Point, dev: str) -> Tensors:
    c = point.shape[1]
    return [*_make_batchnorm(point, dev), torch.randn(c, device=dev), torch.randn(c, device=dev)]


def _def_batchnorm_fwd(fd: FusionDefinition, inputs: Tensors) -> None:
    """Training-mode forward: the statistics and the normalized, affine output in one fusion."""
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    xf = _f(fd, x)
    var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0, keepdim=True)
    flags = [True, False, True, True]
    y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
    y = fd.ops.add(fd.ops.mul(y, _bcast(fd, w, flags)), _bcast(fd, b, flags))
    fd.add_output(fd.ops.cast(y, _dt(inputs[0])))


def _torch_batchnorm_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x.float(), None, None, w, b, training=True, eps=1e-5).to(x.dtype)


def _make_batchnorm_bwd(point: Point, dev: str) -> Tensors:
    (x,) = _make_batchnorm(point, dev)
    c = point.shape[1]
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    return [torch.randn_like(x), x, mean, torch.rsqrt(var + 1e-5), torch.randn(c, device=dev)]


def _def_batchnorm_bwd(fd: FusionDefinition, inputs: Tensors) -> None:
    """Training-mode backward as torch's decomposition of ``native_batch_norm_backward`` writes it: two
    sums per channel over N, H, W (of the gradient, and of it times the centered input), then the input's
    gradient pointwise; the weight's and bias's gradients from the sums."""
    dy, x, mean, rstd, w = (fd.from_pytorch(t) for t in inputs)
    flags = [True, False, True, True]
    n = inputs[0].numel() // inputs[0].shape[1]
    dyf, xf = _f(fd, dy), _f(fd, x)
    centered = fd.ops.sub(xf, _bcast(fd, mean, flags))
    sum_dy = fd.ops.sum(dyf, [0, 2, 3])
    dot = fd.ops.sum(fd.ops.mul(dyf, centered), [0, 2, 3])
    grad_mean = fd.ops.mul(sum_dy, 1.0 / n)
    proj = fd.ops.mul(fd.ops.mul(dot, fd.ops.mul(rstd, rstd)), 1.0 / n)
    scale = fd.ops.mul(rstd, w)
    dx = fd.ops.sub(fd.ops.sub(dyf, _bcast(fd, grad_mean, flags)), fd.ops.mul(centered, _bcast(fd, proj, flags)))
    fd.add_output(fd.ops.cast(fd.ops.mul(dx, _bcast(fd, scale, flags)), _dt(inputs[0])))
    fd.add_output(fd.ops.mul(dot, rstd))
    fd.add_output(sum_dy)


def _torch_batchnorm_bwd(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                         w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.ops.aten.native_batch_norm_backward(dy, x, w, None, None, mean, rstd, True, 1e-5,
                                                           [True, True, True]))


# Embedding backward ---------------------------------------------------------------------------------------


def _make_embedding_bwd(point: Point, dev: str) -> Tensors:
    tokens, hidden, vocab = point.shape
    return [_rand((tokens, hidden), point.dtype, dev), torch.randint(0, vocab, (tokens,), device=dev), vocab]


def _def_embedding_bwd(fd: FusionDefinition, inputs: Tensors) -> None:
    """The weight's gradient: each token's gradient row added into its vocabulary row (fp32 accumulation);
    the vocabulary size is a scalar input, as the backward of ``F.embedding`` gets it."""
    grad, index = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
    vocab = fd.define_scalar(None, DataType.Int)
    acc = fd.ops.full([vocab, inputs[0].shape[1]], 0.0, DataType.Float)
    fd.add_output(fd.ops.cast(fd.ops.index_put_accumulate(acc, index, _f(fd, grad)), _dt(inputs[0])))


def _torch_embedding_bwd(grad: torch.Tensor, index: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.ops.aten.embedding_dense_backward(grad, index, vocab, -1, False)


# seed 003 (the inner-outer persistent case of the earlier benchmark) --------------------------------------


def _make_seed003(point: Point, dev: str) -> Tensors:
    _, rows, cols = point.shape
    return [torch.randn(rows, 1, cols, dtype=point.dtype, device=dev).permute(1, 0, 2)]


def _def_seed003(fd: FusionDefinition, inputs: Tensors) -> None:
    t0 = fd.from_pytorch(inputs[0])
    t2 = fd.ops.sum(fd.ops.squeeze(t0, [0]), [1])
    t4 = fd.ops.add(t0, _bcast(fd, t2, [True, False, True]))
    fd.add_output(t4)
    fd.add_output(fd.ops.sum(fd.ops.squeeze(t4, [0]), [0]))


def _torch_seed003(t0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t4 = t0 + t0.squeeze(0).sum(-1)[None, :, None]
    return t4, t4.squeeze(0).sum(0)


def _only_f32(point: Point) -> str | None:
    return "an fp32 fusion (its outputs keep the input's dtype, sums over rows in bf16 lose the answer)" \
        if point.dtype != torch.float32 else None


def _even_columns(point: Point) -> str | None:
    return None if point.shape[-1] % 2 == 0 else "rotary needs an even head dim"


_REDUCTIONS = {f"{op}_{where}": (_reduction(op, axis), axis) for op in ("sum", "amax", "mean")
               for where, axis in (("inner", 1), ("outer", 0))}

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("bias_row", "2d", _make_bias, _def_bias_row, _torch_bias_row, (5, 33), ("contiguous", "permuted")),
    Family("bias_col", "2d", _make_bias_col, _def_bias_col, _torch_bias_col, (5, 33), ("contiguous", "permuted")),
    Family("mask3d", "2d", _make_mask3d, _def_mask3d, _torch_mask3d, (5, 33), ("contiguous", "permuted"), copies=9),
    Family("mask4d", "2d", _make_mask4d, _def_mask4d, _torch_mask4d, (5, 33), copies=8),
    Family("transpose_in", "2d", _make_transpose, _def_transpose_in, _torch_transpose_in, (37, 33), copies=3,
           scheduler=SchedulerType.transpose),
    Family("transpose_heads_out", "2d", _make_heads, _def_heads_out, _torch_heads_out, (37, 33), copies=8,
           scheduler=SchedulerType.transpose),
    *[Family(name, "2d", _make_2d, define, torch_fn, (5, 33), ("contiguous", "permuted"), copies=1,
             scheduler=SchedulerType.reduction) for name, ((define, torch_fn), _) in _REDUCTIONS.items()],
    Family("layernorm", "2d", _make_layernorm, _def_layernorm, _torch_layernorm, (5, 33),
           scheduler=SchedulerType.inner_persistent),
    Family("rmsnorm", "2d", _make_rmsnorm, _def_rmsnorm, _torch_rmsnorm, (5, 33),
           scheduler=SchedulerType.inner_persistent),
    Family("group_norm", "group_norm", _make_group_norm, _def_group_norm, _torch_group_norm, (3, 5, 33),
           scheduler=SchedulerType.inner_persistent),
    Family("layernorm_bwd", "2d", _make_layernorm_bwd, _def_layernorm_bwd, _torch_layernorm_bwd, (5, 33), copies=3,
           scheduler=SchedulerType.inner_outer_persistent, extra=ROWS_MANY_NARROW),
    Family("rmsnorm_bwd", "2d", _make_rmsnorm_bwd, _def_rmsnorm_bwd, _torch_rmsnorm_bwd, (5, 33), copies=3,
           scheduler=SchedulerType.inner_outer_persistent, extra=ROWS_MANY_NARROW),
    Family("softmax", "2d", _make_2d, _def_softmax, _torch_softmax, (5, 33), ("contiguous", "permuted"),
           scheduler=SchedulerType.inner_persistent, extra=ROWS_FEW_WIDE),
    Family("log_softmax", "2d", _make_2d, _def_log_softmax, _torch_log_softmax, (5, 33),
           scheduler=SchedulerType.inner_persistent, extra=ROWS_FEW_WIDE),
    Family("cross_entropy_fwd", "2d", _make_cross_entropy, _def_cross_entropy_fwd, _torch_cross_entropy_fwd,
           (5, 33), copies=1, scheduler=SchedulerType.inner_persistent, extra=ROWS_FEW_WIDE),
    Family("cross_entropy_bwd", "2d", _make_cross_entropy, _def_cross_entropy_bwd, _torch_cross_entropy_bwd,
           (5, 33), scheduler=SchedulerType.inner_persistent),
    Family("rotary", "rotary", _make_rotary, _def_rotary, _torch_rotary, (2, 3, 4, 8), ("contiguous", "permuted"), copies=3,
           skip=_even_columns),
    Family("batchnorm_stats", "batchnorm", _make_batchnorm, _def_batchnorm_stats, _torch_batchnorm_stats,
           (3, 5, 4, 3), ("contiguous", "channels_last"), scheduler=SchedulerType.reduction),
    Family("batchnorm_fwd", "batchnorm", _make_batchnorm_fwd, _def_batchnorm_fwd, _torch_batchnorm_fwd,
           (3, 5, 4, 3), ("contiguous", "channels_last"), scheduler=SchedulerType.inner_outer_persistent),
    Family("batchnorm_bwd", "batchnorm", _make_batchnorm_bwd, _def_batchnorm_bwd, _torch_batchnorm_bwd,
           (3, 5, 4, 3), ("contiguous", "channels_last"), copies=3, scheduler=SchedulerType.reduction),
    Family("embedding_bwd", "embedding", _make_embedding_bwd, _def_embedding_bwd, _torch_embedding_bwd,
           (9, 16, 7), scheduler=SchedulerType.pointwise),
    Family("relative_softmax", "relative", _make_relative, _def_relative_softmax, _torch_relative_softmax,
           (3, 9, 4), scheduler=SchedulerType.inner_persistent),
    Family("seed003", "seed003", _make_seed003, _def_seed003, _torch_seed003, (1, 6, 33),
           ("permuted",), scheduler=SchedulerType.inner_outer_persistent, skip=_only_f32),
]}


def estimated_bytes(family: Family, shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes a point moves, estimated before building it (the byte cap's measure)."""
    size = torch.tensor([], dtype=dtype).element_size()
    if family.grid == "embedding":
        tokens, hidden, vocab = shape
        return tokens * hidden * size + vocab * hidden * size
    if family.grid == "relative":  # the scores read and written, the two [B*H, S, 2 * span] products read
        bh, s, span = shape
        return bh * s * (2 * s + 4 * span) * size
    return math.prod(shape) * size * family.copies


def fitted(family: Family, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, ...] | None:
    """``shape`` with its rows halved until the point moves at most ``MAX_POINT_BYTES`` (2-D grids), or None
    where it does not fit."""
    while estimated_bytes(family, shape, dtype) > MAX_POINT_BYTES:
        if family.grid != "2d" or shape[0] < 2:
            return None
        shape = (shape[0] // 2, *shape[1:])
    return shape


def full_points() -> list[Point]:
    """Every family over its grid under ``MAX_POINT_BYTES``: 2-D families in bf16 on every (rows, columns), in
    fp32 and their other layouts on the large ones; the other grids in both dtypes and every layout. Ordered
    family by family in turns, so a run cut short (``--budget-s``) or a shard still spans every family."""
    per_family = []
    for family in FAMILIES.values():
        points = []
        if family.grid == "2d":
            variants = [(shape, BF, "contiguous") for shape in GRIDS["2d"]]
            variants += [(shape, F32, "contiguous") for shape in ROWS_COLUMNS_LARGE]
            variants += [(shape, BF, layout) for shape in ROWS_COLUMNS_LARGE for layout in family.layouts[1:]]
            variants += [(shape, dtype, "contiguous") for shape in family.extra for dtype in DTYPES]
        else:
            variants = list(itertools.product(GRIDS[family.grid], DTYPES, family.layouts))
        for shape, dtype, layout in variants:
            size = fitted(family, shape, dtype)
            if size is not None:
                points.append(Point(family.name, size, dtype, layout))
        per_family.append(points)
    return [p for turn in itertools.zip_longest(*per_family) for p in turn if p is not None]


#: ``--quick``: a few points per family (the shapes real graphs make, the issue's cases among them).
QUICK: tuple[Point, ...] = (
    Point("bias_row", (16384, 4096), BF), Point("bias_row", (4097, 11008), BF, "permuted"),
    Point("bias_col", (16384, 4096), BF), Point("mask3d", (1024, 1000), BF),
    Point("mask4d", (4096, 4096), BF), Point("mask4d", (1024, 127), F32),
    Point("transpose_in", (4096, 4096), F32), Point("transpose_in", (4097, 1000), BF),
    Point("transpose_heads_out", (4096, 4096), BF),
    Point("sum_inner", (1024, 65536), F32), Point("sum_inner", (65536, 127), BF),
    Point("sum_outer", (16384, 4096), F32), Point("amax_inner", (4097, 11008), BF),
    Point("amax_outer", (65536, 1000), BF), Point("mean_inner", (16384, 4096), BF, "permuted"),
    Point("mean_outer", (1024, 32000), F32),
    Point("layernorm", (16384, 4096), BF), Point("layernorm", (4097, 1000), F32),
    Point("rmsnorm", (16384, 4096), BF), Point("rmsnorm", (1024, 11008), BF),
    Point("group_norm", (8, 512, 15999), BF), Point("group_norm", (32, 128, 4096), F32),
    Point("layernorm_bwd", (8192, 4096), BF), Point("layernorm_bwd", (4097, 1000), F32),
    Point("layernorm_bwd", (100352, 96), BF),
    Point("rmsnorm_bwd", (8192, 4096), BF), Point("rmsnorm_bwd", (1024, 11008), BF),
    Point("softmax", (1024, 65536), BF), Point("softmax", (512, 128256), BF), Point("softmax", (4097, 127), F32),
    Point("log_softmax", (1024, 32000), BF), Point("log_softmax", (63, 262144), F32),
    Point("softmax", (8, 262144), BF), Point("log_softmax", (130, 131072), BF),
    Point("cross_entropy_fwd", (512, 128256), BF), Point("cross_entropy_fwd", (4097, 32000), BF),
    Point("cross_entropy_bwd", (512, 128256), BF), Point("cross_entropy_bwd", (2047, 32000), BF),
    Point("rotary", (1, 4096, 32, 128), BF, "permuted"), Point("rotary", (8, 512, 16, 64), BF),
    Point("batchnorm_stats", (32, 256, 56, 56), F32), Point("batchnorm_stats", (32, 256, 56, 56), BF, "channels_last"),
    Point("batchnorm_fwd", (32, 64, 112, 112), BF), Point("batchnorm_fwd", (32, 256, 56, 56), BF, "channels_last"),
    Point("batchnorm_bwd", (32, 256, 56, 56), BF, "channels_last"), Point("batchnorm_bwd", (32, 64, 112, 112), BF),
    Point("embedding_bwd", (4096, 1024, 32000), BF), Point("embedding_bwd", (8192, 4096, 1000), F32),
    Point("seed003", (1, 4096, 4096), F32, "permuted"),
    Point("relative_softmax", (128, 512, 256), BF),
)


def tiny_points() -> list[Point]:
    """The CPU dry run: each family and layout once at its tiny shape (bf16 where the family takes it)."""
    points = []
    for family in FAMILIES.values():
        for layout in family.layouts:
            point = Point(family.name, family.tiny, BF, layout)
            points.append(point if family.skip(point) is None else dataclasses.replace(point, dtype=F32))
    return points


def float64_outputs(family: Family, inputs: Tensors) -> tuple[torch.Tensor, ...]:
    """The torch function's outputs computed from the inputs in float64 (the exact values the bf16 / fp32
    outputs round)."""
    wide = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    return outputs_of(family.torch_fn(*wide))


def _as_close_as_torch(got: torch.Tensor, torchs: torch.Tensor, exact: torch.Tensor, atol: float) -> bool:
    """Whether ``got`` errs from ``exact`` by at most twice what torch's own output does, plus ``atol``."""
    mine, theirs = (got.double() - exact).abs(), (torchs.double() - exact).abs()
    return bool((mine <= 2 * theirs.max() + atol).all())


def outputs_of(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def moved_bytes(inputs: Tensors, outputs: Sequence[torch.Tensor]) -> int:
    """Bytes the fusion must move: each tensor input read once and each output written once."""
    return sum(t.numel() * t.element_size() for t in (*inputs, *outputs) if isinstance(t, torch.Tensor))


def check(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], name: str,
          exact: Callable[[], Sequence[torch.Tensor]] | None = None) -> None:
    """pyfuser's outputs against the torch function's, relative to each output's scale: sums over many rows
    in bf16 differ by the order of additions. Where they differ by more, ``exact`` (the torch function in
    float64) judges: pyfuser passes when its error is within twice torch's own plus the tolerance (ATen's
    bf16 batch-norm backward errs by 4e-3 of scale on 32x64x112x112). Raises AssertionError naming the
    point and the output."""
    if len(got) != len(expected):
        raise AssertionError(f"{name}: pyfuser gave {len(got)} outputs, torch {len(expected)}")
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g.shape != e.shape:
            raise AssertionError(f"{name}: output {k} has shape {tuple(g.shape)}, torch's {tuple(e.shape)}")
        scale = max(1.0, float(e.float().abs().max())) if e.numel() else 1.0
        tol = 3e-2 if torch.bfloat16 in (g.dtype, e.dtype) else 2e-3
        try:
            torch.testing.assert_close(g.float(), e.float(), atol=tol * scale, rtol=tol)
        except AssertionError as err:
            if exact is not None and _as_close_as_torch(g, e, exact()[k], tol * scale):
                continue
            raise AssertionError(f"{name}: output {k} differs from torch's: {err}") from None
