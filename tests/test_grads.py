"""``cockpit_lite.utils.grads``: the gradient the Cockpit reads, a sparse one as its dense form."""

import math

import pytest
import torch
from torch import nn

import problems
from cockpit_lite import configuration
from cockpit_lite.utils.grads import held


def test_held_is_the_dense_gradient_and_copies_on_request():
    weight = nn.Parameter(torch.randn(6, 3))
    assert held(weight) is None
    nn.functional.embedding(torch.tensor([[1, 4, 1]]), weight, sparse=True).sum().backward()
    assert weight.grad.is_sparse
    expected = torch.zeros(6, 3)
    expected[1], expected[4] = 2.0, 1.0  # row 1 looked up twice
    assert torch.equal(held(weight), expected) and not held(weight).is_sparse
    dense = nn.Parameter(torch.randn(2))
    dense.grad = torch.ones(2)
    assert held(dense).data_ptr() == dense.grad.data_ptr()
    copy = held(dense, copy=True)
    assert torch.equal(copy, dense.grad) and copy.data_ptr() != dense.grad.data_ptr()


def _record(sparse, level):
    """Three SGD steps of a small float64 embedding model (``problems.run``, strict): its record and parameters.
    (The sparse and the dense gradient sum a row's repeated lookups in different orders: float64 keeps the
    two runs within 1e-15, so no histogram count or product count can differ by the rounding.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 3)).double()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 10, (6, 3), generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(3)]
    problem = problems.Problem("embedding", "mean", 6, model, nn.CrossEntropyLoss(), batches)
    cp, _ = problems.run(problem, configuration(level) if level else [], diagnose=level is None)
    cp.close()
    return cp.get_output(), [p.detach().clone() for p in model.parameters()]


def _leaves(value, path=""):
    if isinstance(value, dict):
        return [leaf for k, v in sorted(value.items()) for leaf in _leaves(v, f"{path}/{k}")]
    if isinstance(value, (list, tuple)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}/{i}")]
    if hasattr(value, "tolist"):
        return _leaves(value.tolist(), path)
    return [(path, value)]


@pytest.mark.parametrize("level", ["full", None])  # every quantity of Cockpit's full level; the default diagnosis
def test_a_sparse_embedding_gradient_gives_the_records_of_a_dense_one(level):
    """``nn.Embedding(sparse=True)`` leaves a sparse gradient (the optimizer steps with it): every quantity
    and the diagnosis record what the same model with ``sparse=False`` records, and training goes on
    as it would (the dense twin is the reference: its gradient holds the same numbers)."""
    (sparse, trained), (dense, reference) = (_record(s, level) for s in (True, False))
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-14) for a, b in zip(trained, reference))
    assert sorted(sparse) == sorted(dense)
    for step in dense:
        left, right = _leaves(sparse[step]), _leaves(dense[step])
        assert [p for p, _ in left] == [p for p, _ in right], step
        for (path, a), (_, b) in zip(left, right):
            if isinstance(b, float) and not isinstance(a, str):
                assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12), (step, path, a, b)
            elif "Time" not in path:
                assert a == b, (step, path, a, b)
