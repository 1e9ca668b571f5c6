"""The loss of a language model (log-softmax + NLL, as ``F.cross_entropy`` traces) compiled by the backend:
one pass over the logits per direction. The forward's row kernel computes the log-softmax statistics and
the target's term together and saves per-row values only (the backward recomputes the log-probabilities
from the logits, as Inductor's partition does); the backward writes the logits' gradient in one kernel
(no logits-sized fill and scatter). Through generated kernels (Triton's interpreter) against eager."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from pyfuser.integrations.torch_compile import PyfuserBackend


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _shifted_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss: labels padded with ignore_index and shifted by one, logits in float32."""
    labels = F.pad(labels, (0, 1), value=-100)
    shift = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), shift.view(-1), ignore_index=-100)


def _run(fn: Callable[..., torch.Tensor], logits: torch.Tensor, *rest: Any) -> tuple[PyfuserBackend, list[Any]]:
    """The compiled and the eager loss and logits gradient (the compiled one on its third call: bound)."""
    backend = PyfuserBackend(triton_interpreter=True)
    compiled = torch.compile(fn, backend=backend)
    results = []
    for run in (compiled, compiled, compiled, fn):
        x = logits.detach().clone().requires_grad_()
        loss = run(x, *rest)
        loss.sum().backward()
        results.append((loss.detach(), x.grad))
    (got, got_grad), (want, want_grad) = results[2], results[3]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    return backend, results


def _eager_compute(backend: PyfuserBackend, kind: str) -> list[str]:
    """The ops of a graph left in eager that compute (not views, not the target check)."""
    views = ("view", "unsqueeze", "slice", "clone", "_assert_async", "expand", "squeeze")
    graph = next(g for g in backend.graphs if g.kind == kind)
    return [why for name, why in graph.eager.items() if not name.startswith(views)]


def _lm_case(batch: int, seq: int, vocab: int, dtype: torch.dtype) -> PyfuserBackend:
    g = torch.Generator().manual_seed(batch * 100 + seq * 10 + vocab)
    logits = torch.randn(batch, seq, vocab, generator=g).to(dtype)
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    backend, _ = _run(_shifted_lm_loss, logits, labels)
    return backend


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("batch", "seq", "vocab"), [(2, 8, 37), (1, 2, 5), (1, 2, 1), (3, 5, 130)])
def test_lm_loss_runs_no_aten_loss(batch: int, seq: int, vocab: int, dtype: torch.dtype) -> None:
    """Odd vocabularies, one row (``seq`` 2: one shifted label, the other ignored), one class: the loss
    and its gradient are eager's, and no ATen loss op (``nll_loss_forward`` / ``_backward``: a gather, a
    logits-sized fill and a scatter) runs between the regions."""
    backend = _lm_case(batch, seq, vocab, dtype)
    assert not _eager_compute(backend, "forward") and not _eager_compute(backend, "backward")


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("batch", "seq", "vocab"), [(2, 8, 37), (3, 5, 130)])
def test_lm_loss_saves_rows_and_its_backward_is_one_kernel(batch: int, seq: int, vocab: int,
                                                           dtype: torch.dtype) -> None:
    """The forward saves per-row statistics, not the logits-sized log-probabilities (the backward reads no
    logits-sized value but the logits), and the backward is one kernel over the logits; bf16 logits are
    converted to float32 inside the loss kernels (reshaped first: a reshape is no kernel boundary then),
    never written out as a float32 copy."""
    backend = _lm_case(batch, seq, vocab, dtype)
    forward = next(gr for gr in backend.graphs if gr.kind == "forward")
    assert not any(re.match(r"  kernel pointwise_\w*kernel -> _to_copy", line)
                   for r in forward.regions for line in r.summary().splitlines()), forward.regions[0].summary()
    backward = next(gr for gr in backend.graphs if gr.kind == "backward")
    wide = [n.name for n in backward.graph_module.graph.nodes if n.op == "placeholder"
            and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].numel() == batch * seq * vocab]
    assert len(wide) == 1, wide
    (loss_backward,) = backward.regions
    assert loss_backward.summary().count(" kernel ") == 1, loss_backward.summary()


@pytest.mark.filterwarnings("error::pyfuser.integrations.torch_compile.region.KernelFallbackWarning")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_nll_loss_options_match_eager(reduction: str, weighted: bool) -> None:
    """Class weights, every reduction, ignored rows (including one whose label is ignore_index 3, a valid
    class number) and a 1-D input (no batch axis)."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 11, generator=g)
    target = torch.tensor([3, 0, 10, 3, 5, 1])
    weight = torch.rand(11, generator=g) + 0.5 if weighted else None

    def loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(F.log_softmax(x, -1), t, weight=weight, ignore_index=3, reduction=reduction)

    _run(loss, logits, target)
    _run(loss, logits[0], target[1])  # one row, no batch axis: target 0


def test_out_of_range_target_is_an_error() -> None:
    """A target neither a class nor ignore_index fails (eager raises too), never a silently wrong loss."""
    compiled = torch.compile(lambda x, t: F.cross_entropy(x, t), backend=PyfuserBackend())
    with pytest.raises(RuntimeError, match="nll_loss: a target is out of range for 5 classes"):
        compiled(torch.randn(3, 5), torch.tensor([0, 5, 1]))


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_empty_batch_matches_eager(reduction: str) -> None:
    """No rows: no target to check (a minimum over no rows would not trace), the loss and gradient eager's."""
    _run(lambda x, t: F.cross_entropy(x, t, reduction=reduction), torch.randn(0, 5), torch.zeros(0, dtype=torch.long))
