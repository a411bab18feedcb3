"""Every diagnosis test runs twice, with one torch thread and with two: float reductions differ
with the thread count, and no finding (kind, layer, step) may hinge on it. The thread count is
restored afterwards."""

import pytest
import torch


@pytest.fixture(autouse=True, params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
