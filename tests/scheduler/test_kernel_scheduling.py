"""The schedulers own a kernel segment's size buckets and the final step of a grid reduction
(``scheduler/kernel_scheduling.py``); the runtime keeps a kernel per bucket and picks it at launch."""

from __future__ import annotations

import torch

from pyfuser import FusionDefinition
from pyfuser.host_ir.nodes import LaunchKernel
from pyfuser.runtime.size_dispatch import SizeDispatchedKernel
from pyfuser.scheduler.kernel_scheduling import KEPT_CAP, KernelScheduling, size_bucket
from pyfuser.scheduler.registry import SchedulerType


def _row_sums() -> FusionDefinition:
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(fd.ops.exp(t), [1]))
    return fd


def test_a_bucket_is_the_next_power_of_two_of_the_reduced_and_the_capped_kept_extent() -> None:
    assert size_bucket(33, 100_000) == (64, KEPT_CAP)
    assert size_bucket(0, 0) == (1, 1) and size_bucket(64, 3) == (64, 4)
    reduction = KernelScheduling.of(SchedulerType.reduction, torch.device("cpu"))
    buckets = reduction.buckets(_row_sums().fusion)
    assert buckets is not None
    assert buckets({"i0": 100_000, "i1": 33}) == (64, KEPT_CAP) and buckets({"i0": 5, "i1": 128}) == (128, 8)
    assert KernelScheduling.of(SchedulerType.pointwise, torch.device("cpu")).buckets(_row_sums().fusion) is None


def test_launches_of_one_bucket_share_a_kernel(device: str, kernel_options: list[str]) -> None:
    """Row lengths 33 and 40 fall in one bucket (64), 70 in the next: two kernels, each scheduled for
    its bucket's sizes, results as torch's."""
    fd = _row_sums()
    for n in (33, 40, 70):
        x = torch.randn(6, 2 * n, device=device)[:, ::2]  # strided rows
        (got,) = fd.execute([x], _enable_options=kernel_options)
        torch.testing.assert_close(got, x.exp().sum(1))
    (segment,) = [n.segment for n in fd.fec.last_program.container.walk() if isinstance(n, LaunchKernel)]
    assert isinstance(segment, SizeDispatchedKernel)
    assert sorted(segment._by_bucket) == [(64, 8), (128, 8)]
