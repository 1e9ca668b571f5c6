"""The P2P pipeline's Host IR nodes as data: a send names the remote block it writes and may wait for a fork
recorded before this rank's GEMM; a receive does neither (errors name the transfer)."""

from __future__ import annotations

import pytest

from pyfuser import FusionDefinition, TensorView
from pyfuser.comm.p2p import P2PCommunication, P2PCommunicationType, P2PFork, P2PStep


def _tensors() -> tuple[TensorView, TensorView, TensorView]:
    with FusionDefinition() as fd:
        x, channel, block = fd.define_tensor([-1, 4]), fd.define_tensor([-1, 4]), fd.define_tensor([-1, 4])
        fd.add_output(x)
    return x, channel, block


def test_a_send_after_a_fork_prints_it_and_reads_its_buffer() -> None:
    x, channel, block = _tensors()
    fork = P2PFork("3", [x], "cuda")
    send = P2PCommunication(P2PCommunicationType.SEND, x, channel, 1, "cuda", P2PStep("3.1"), "3.1",
                            remote=block, fork=fork)
    assert fork.inputs == [x] and not fork.outputs and send.inputs == [x]
    assert fork.to_string().startswith("Fork P2PCommunication 3 ready: T0")
    assert "remote=T2" in send.to_string() and "after=fork 3" in send.to_string()


def test_a_receive_waits_for_no_fork_and_a_send_needs_its_remote_block() -> None:
    x, channel, block = _tensors()
    fork = P2PFork("3", [x], "cuda")
    with pytest.raises(ValueError, match=r"P2PCommunication 3\.2: only a send waits for a fork"):
        P2PCommunication(P2PCommunicationType.RECV, block, channel, 1, "cuda", P2PStep("3.1"), "3.2",
                         fork=fork)
    with pytest.raises(ValueError, match=r"P2PCommunication 3\.1: a send needs the remote block it writes"):
        P2PCommunication(P2PCommunicationType.SEND, x, channel, 1, "cuda", P2PStep("3.1"), "3.1")
