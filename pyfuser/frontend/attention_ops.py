"""Attention of ``fd.ops``: ``sdpfa_fwd`` / ``sdpfa_bwd`` with nvFuser's arguments and outputs
(see ``ir/ops/attention.py`` for how they are evaluated)."""

from __future__ import annotations

from pyfuser.frontend.ops_base import Operand, OpsBase, check_same_extent, clone_id
from pyfuser.ir.base import Val
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.ops.attention import SdpaBwdOp, SdpaFwdOp
from pyfuser.ir.tensor_view import TensorView


class AttentionOps(OpsBase):
    def _check_qkv(self, op: str, q: TensorView, k: TensorView, v: TensorView) -> None:
        for tv in (q, k, v):
            if tv.ndim < 3:
                raise ValueError(f"{op}: {tv.short_name} has rank {tv.ndim}; query, key and value are [N*, H, L, E] "
                                 "(rank >= 3)")
            if not tv.dtype.is_floating:
                raise TypeError(f"{op}: {tv.short_name} has dtype {tv.dtype}; expected a floating-point tensor")
        for tv in (k, v):
            if tv.ndim != q.ndim or tv.dtype != q.dtype:
                raise ValueError(f"{op}: {tv.short_name} ({tv.dtype}, rank {tv.ndim}) must match query "
                                 f"{q.short_name} ({q.dtype}, rank {q.ndim})")
        iq, ik, iv = (t.get_logical_domain(no_reductions=True) for t in (q, k, v))
        check_same_extent(op, q, q.ndim - 1, iq[-1], k, k.ndim - 1, ik[-1])
        check_same_extent(op, k, k.ndim - 2, ik[-2], v, v.ndim - 2, iv[-2])
        for d in range(q.ndim - 2):
            check_same_extent(op, q, d, iq[d], k, d, ik[d])
            check_same_extent(op, q, d, iq[d], v, d, iv[d])

    def _scalar(self, op: str, name: str, value: Operand | None, floating: bool) -> Val | None:
        if value is None:
            return None
        val = self._val(value, f"{op} {name}")
        if isinstance(val, TensorView) or (floating and not (val.dtype.is_floating or val.dtype.is_integral)) or \
                (not floating and val.dtype is not DataType.Bool):
            raise TypeError(f"{op}: {name} must be a {'real number' if floating else 'bool'} or scalar, got {val}")
        return val

    def sdpfa_fwd(self, query: TensorView, key: TensorView, value: TensorView, bias: TensorView | None = None,
                  mask: TensorView | None = None, dropout_p: Operand | None = None, is_causal: Operand | None = None,
                  scale: Operand | None = None) -> tuple[TensorView, TensorView, TensorView, TensorView]:
        """Scaled dot-product attention: ``(output, logsumexp, philox_seed, philox_offset)`` for query
        [N*, H, L, E], key [N*, H, S, E], value [N*, H, S, Ev]; ``bias`` and ``mask`` are additive and
        broadcast to [N*, H, L, S]; ``scale`` defaults to 1 / sqrt(E)."""
        q, k, v = (self._tv(t, f"sdpfa_fwd {n}") for t, n in ((query, "query"), (key, "key"), (value, "value")))
        self._check_qkv("sdpfa_fwd", q, k, v)
        options: dict[str, Val | None] = {}
        for name, extra in (("bias", bias), ("mask", mask)):
            tv = None if extra is None else self._tv(extra, f"sdpfa_fwd {name}")
            if tv is not None and tv.ndim > q.ndim:
                raise ValueError(f"sdpfa_fwd: {name} {tv.short_name} has rank {tv.ndim}; it must broadcast to "
                                 f"[N*, H, L, S] (rank {q.ndim})")
            options[name] = tv
        options["dropout_p"] = self._scalar("sdpfa_fwd", "dropout_p", dropout_p, True)
        options["is_causal"] = self._scalar("sdpfa_fwd", "is_causal", is_causal, False)
        options["scale"] = self._scalar("sdpfa_fwd", "scale", scale, True)
        iq, iv = q.get_logical_domain(no_reductions=True), v.get_logical_domain(no_reductions=True)
        out = self._new_tv([clone_id(self, i) for i in iq[:-1]] + [clone_id(self, iv[-1])], q.dtype)
        lse = self._new_tv([clone_id(self, i) for i in iq[:-1]], DataType.Float)
        seed = self._new_tv([self._id(2)], DataType.UInt64)
        offset = self._new_tv([], DataType.UInt64)
        SdpaFwdOp(self._fusion, [out, lse, seed, offset], q, k, v, options)
        return out, lse, seed, offset

    def sdpfa_bwd(self, grad_output: TensorView, query: TensorView, key: TensorView, value: TensorView,
                  output: TensorView, logsumexp: TensorView, dropout_p: Operand, is_causal: Operand,
                  philox_seed: TensorView, philox_offset: TensorView,
                  scale: Operand | None = None) -> tuple[TensorView, TensorView, TensorView]:
        """Gradients ``(grad_query, grad_key, grad_value)`` of ``sdpfa_fwd`` (without bias or mask), from
        its inputs and outputs; dropout is replayed from ``philox_seed``."""
        q, k, v = (self._tv(t, f"sdpfa_bwd {n}") for t, n in ((query, "query"), (key, "key"), (value, "value")))
        self._check_qkv("sdpfa_bwd", q, k, v)
        tensors = [self._tv(t, f"sdpfa_bwd {n}") for t, n in ((grad_output, "grad_output"), (output, "output"),
                                                              (logsumexp, "logsumexp"), (philox_seed, "philox_seed"),
                                                              (philox_offset, "philox_offset"))]
        grad, out, lse, seed, offset = tensors
        if grad.ndim != q.ndim:
            raise ValueError(f"sdpfa_bwd: grad_output {grad.short_name} has rank {grad.ndim} but query "
                             f"{q.short_name} has rank {q.ndim}")
        p = self._scalar("sdpfa_bwd", "dropout_p", dropout_p, True)
        causal = self._scalar("sdpfa_bwd", "is_causal", is_causal, False)
        if p is None or causal is None:
            raise TypeError("sdpfa_bwd: dropout_p and is_causal are required (as sdpfa_fwd used them)")
        s = self._scalar("sdpfa_bwd", "scale", scale, True)
        outputs = [self._new_tv([clone_id(self, i) for i in t.get_logical_domain(no_reductions=True)], t.dtype)
                   for t in (q, k, v)]
        inputs: list[Val] = [grad, q, k, v, out, lse, p, causal, seed, offset]
        SdpaBwdOp(self._fusion, outputs, inputs + ([s] if s is not None else []))
        return outputs[0], outputs[1], outputs[2]

