"""One CPU thread for every test of the pre-flight checks (restored afterwards): the models are tiny,
and more threads only fight over the cores."""

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
