"""Arguments of ATen calls as the torch.compile lowering reads them from FX nodes: a device, a list."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from pyfuser.integrations.torch_compile.lowering import device_arg, list_arg


def test_a_device_argument_is_a_device_a_name_or_an_index() -> None:
    assert device_arg("cpu") == torch.device("cpu") and device_arg(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(TypeError, match=r"expected a device argument, got \[1\]"):
        device_arg([1])


def test_a_list_argument_must_be_a_list() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    permute = graph.call_function(torch.ops.aten.permute.default, (x, [1, 0]))
    bad = graph.call_function(torch.ops.aten.permute.default, (x, 3))
    assert list(list_arg(permute, 1)) == [1, 0]
    with pytest.raises(TypeError, match=r"aten.permute.default: argument 1 must be a list, got 3"):
        list_arg(bad, 1)

