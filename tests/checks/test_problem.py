"""``Problem``: the batch it accepts, and the perturbation the dependence checks apply, by hand."""

import pytest
import torch
from check_cases import TokenTable

from cockpit_lite.checks.problem import Problem


def test_perturbed_adds_noise_of_the_inputs_std_at_the_index_only():
    """Two entries 1 and 3: std sqrt(2) (unbiased); the noise is the next standard normal draw times it."""
    x = torch.tensor([[1.0], [3.0]])
    problem = Problem(torch.nn.Linear(1, 2), torch.nn.functional.cross_entropy, (x, torch.tensor([0, 1])))
    torch.manual_seed(0)
    out = problem.perturbed(x, (1,))
    torch.manual_seed(0)
    noise = torch.randn(1, 1)
    assert torch.equal(out[0], x[0])
    torch.testing.assert_close(out[1] - x[1], 2.0 ** 0.5 * noise[0], rtol=1e-6, atol=0)


def test_perturbed_tokens_are_other_tokens_of_the_vocabulary_at_the_index_only():
    """Tokens of an embedding of 5: every token at the index is replaced by another of 0..4."""
    x = torch.arange(5).repeat(4, 1)  # each token id at each position
    model = torch.nn.Sequential(torch.nn.Embedding(5, 2), torch.nn.Flatten(), torch.nn.Linear(10, 2))
    problem = Problem(model, torch.nn.functional.cross_entropy, (x, torch.zeros(4, dtype=torch.long)))
    out = problem.perturbed(x, (slice(1, 3),))
    assert out.dtype == x.dtype and torch.equal(out[[0, 3]], x[[0, 3]])
    assert bool((out[1:3] != x[1:3]).all()) and bool(((out >= 0) & (out < 5)).all())


def test_perturbed_tokens_of_a_vocabulary_of_two_flip():
    """Two token ids: each at the index becomes the other one."""
    x = torch.tensor([[0, 1, 1], [1, 0, 1], [0, 0, 1]])
    model = torch.nn.Sequential(torch.nn.Embedding(2, 2), torch.nn.Flatten(), torch.nn.Linear(6, 2))
    problem = Problem(model, torch.nn.functional.cross_entropy, (x, torch.zeros(3, dtype=torch.long)))
    out = problem.perturbed(x, (slice(0, 2),))
    assert torch.equal(out[:2], 1 - x[:2]) and torch.equal(out[2], x[2])


def test_perturbed_inputs_of_a_small_scale_get_noise_of_their_scale():
    """Entries 0.01 and 0.03: std 0.01·√2, below 1 (the floor of the scale is 1e-3, not 1)."""
    x = torch.tensor([[0.01], [0.03]], dtype=torch.float64)
    problem = Problem(torch.nn.Linear(1, 2).double(), torch.nn.functional.cross_entropy, (x, torch.tensor([0, 1])))
    torch.manual_seed(0)
    out = problem.perturbed(x, (1,))
    torch.manual_seed(0)
    noise = torch.randn(1, 1, dtype=torch.float64)
    torch.testing.assert_close(out[1] - x[1], 0.02 / 2 ** 0.5 * noise[0], rtol=1e-6, atol=0)


def test_perturbed_tokens_are_drawn_on_the_inputs_device():
    """Tokens on the ``meta`` device (shapes without data, standing in for a GPU): the new tokens are drawn there
    too, since a shift drawn on the CPU cannot be added to them."""
    x = torch.zeros(4, 3, dtype=torch.long)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 2), torch.nn.Flatten(), torch.nn.Linear(6, 2))
    problem = Problem(model, torch.nn.functional.cross_entropy, (x, torch.zeros(4, dtype=torch.long)))
    out = problem.perturbed(x.to("meta"), (slice(1, 3),))
    assert out.device.type == "meta" and out.shape == (4, 3) and out.dtype == torch.long


def test_perturbed_one_entry_adds_standard_normal_noise():
    """One entry has no spread to measure: the noise is the next standard normal draw (scale 1)."""
    x = torch.tensor([[2.0]])
    problem = Problem(torch.nn.Linear(1, 2), torch.nn.functional.cross_entropy, (x, torch.tensor([0])))
    torch.manual_seed(0)
    out = problem.perturbed(x, (0,))
    torch.manual_seed(0)
    torch.testing.assert_close(out, x + torch.randn(1, 1), rtol=1e-6, atol=0)


def test_a_sparse_embedding_is_checked_as_its_dense_twin():
    """``nn.Embedding(sparse=True)``: every check's verdict and value equal the same model's with
    ``sparse=False`` (the copies' embeddings give dense gradients, the same values); the user's model
    keeps its sparse gradients."""
    from torch import nn

    from cockpit_lite import checks

    reports = {}
    for sparse in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(10, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 3))
        x, y = torch.randint(0, 10, (32, 3)), torch.randint(0, 3, (32,))
        report = checks.run(model, nn.CrossEntropyLoss(), (x, y), task="classification", num_classes=3)
        reports[sparse] = [(r.name, r.passed, r.value, r.message) for r in report.results.values()]
        assert model[0].sparse == sparse
    assert reports[True] == reports[False]
    assert dict((name, passed) for name, passed, _, _ in reports[True])["nonzero_gradients"] is True


def test_the_initial_predictions_need_at_least_two_classes():
    """One output column: skipped, naming the check and the count; two columns: their count, nothing skipped."""
    x, y = torch.randn(8, 3), torch.zeros(8, dtype=torch.long)
    one = Problem(torch.nn.Linear(3, 1), torch.nn.functional.cross_entropy, (x, y))
    classes, skipped = one.initial_classes("init_loss", "regression")
    assert classes is None and (skipped.name, skipped.status) == ("init_loss", "skipped")
    assert skipped.message == "needs at least 2 classes (got 1)"
    two = Problem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, (x, y))
    assert two.initial_classes("init_loss", "regression") == (2, None)


@pytest.mark.parametrize("batch", [(torch.zeros(4, 3), [0, 1, 0, 1]), ([[0.0] * 3] * 4, torch.zeros(4, dtype=torch.long))])
def test_a_batch_that_is_not_two_tensors_is_refused(batch):
    """Either element not a tensor (labels as a list, inputs as nested lists): refused naming the form."""
    with pytest.raises(TypeError, match=r"batch must be a pair of tensors \(x, y\)"):
        Problem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, batch)
    assert Problem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy,
                   tuple(torch.as_tensor(part) for part in batch)).batch_size == 4  # the fix: tensors


class _Mixed(torch.nn.Module):
    """Two kinds of batch normalisation, a dropout and an attention layer with dropout."""

    def __init__(self):
        super().__init__()
        self.bn1, self.bn2 = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm2d(3)
        self.drop, self.attention = torch.nn.Dropout(0.5), torch.nn.MultiheadAttention(4, 2, dropout=0.3)


def test_a_copy_trains_with_dropout_unless_told_and_names_the_mixers_it_puts_in_eval_mode():
    model = _Mixed().eval()  # (the copy is in train mode whatever the user's model is in)
    problem = Problem(model, torch.nn.functional.cross_entropy, (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))
    plain, notes = problem.copy()
    assert notes == [] and plain.training and plain.drop.training and plain.bn1.training
    assert plain.attention.dropout == 0.3
    quiet, _ = problem.copy(dropout=False)
    assert not quiet.drop.training and quiet.attention.dropout == 0.0 and quiet.bn1.training
    fixed, notes = problem.copy(mixing="eval")
    assert notes == ["BatchNorm1d/BatchNorm2d (2) in eval mode: they mix samples by design in train mode"]
    assert not fixed.bn1.training and not fixed.bn2.training and fixed.drop.training
    assert model.attention.dropout == 0.3 and not model.training  # the user's model untouched


def test_tokens_without_an_input_embedding_have_no_leaf():
    """Token ids read by a table of the model's own: the output, and no tensor to differentiate."""
    model, ids = TokenTable(), torch.tensor([0, 3, 4, 1])
    output, leaf = Problem(model, torch.nn.functional.cross_entropy, (ids, ids % 3)).forward_with_leaf(model, ids)
    assert leaf is None and torch.equal(output, model.table[ids])
