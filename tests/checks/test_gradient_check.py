"""``gradient_check``: names the parameter upstream of a wrong backward; kinks and BatchNorm pass."""

from check_cases import BROKEN, CASES

import pytest
import torch

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["gradient_check"])["gradient_check"]


def test_wrong_custom_backward_names_the_parameter():
    result = _result(BROKEN["wrong_backward"]())
    assert result.passed is False and result.message.startswith("`1.")  # the layer before the custom ReLU


def test_relu_maxpool_batchnorm_and_attention_agree():
    for name in ("bn_cnn", "causal_transformer", "lstm_classifier"):
        result = _result(CASES[name]())
        assert result.passed and result.value < 1e-5, result.message
        assert "parameter tensors agree (largest error" in result.message


class _DetachedBranch(__import__("torch").nn.Module):
    """Every parameter gets a gradient, yet ``body``'s features reach the head's second input detached:
    the check must see the dependence autograd drops."""

    def __init__(self):
        from torch import nn

        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh())
        self.head = nn.Linear(32, 10)
        self.gate = nn.Linear(32, 10)

    def forward(self, x):
        h = self.body(x)
        return self.head(h) * self.gate(h.detach()).sigmoid()  # BUG: .detach() on one of the two uses


def _digits_batch():
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images[:32], dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(digits.target[:32])


def test_a_detach_inside_forward_fails():
    import torch

    torch.manual_seed(0)
    result = checks.run(_DetachedBranch(), torch.nn.functional.cross_entropy, _digits_batch(),
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed is False and result.message.startswith("`body.1."), result.message


def test_a_detached_layer_without_any_gradient_fails_and_says_the_graph_is_cut():
    result = _result(BROKEN["detached_layer"]())
    assert result.passed is False and "no gradient" in result.message and "detach" in result.fix


def test_frozen_parameters_are_not_checked():
    result = _result(CASES["frozen_mlp"]()) if "frozen_mlp" in CASES else _result(BROKEN["frozen_layer"]())
    assert result.passed, result.message


class _NonContiguousFirst(__import__("torch").nn.Module):
    """A non-contiguous parameter first (not checked: perturbing ``view(-1)`` needs contiguous memory), then a
    layer whose output is detached: its parameters get no gradient although the loss depends on them."""

    def __init__(self):
        import torch

        super().__init__()
        self.first = torch.nn.Parameter(0.1 * torch.randn(10, 64).t())
        self.cut = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = x.flatten(1)
        return x @ self.first + self.cut(x).detach() ** 2


def test_the_parameters_after_a_non_contiguous_one_are_checked():
    import torch

    torch.manual_seed(0)
    result = checks.run(_NonContiguousFirst(), torch.nn.functional.cross_entropy, _digits_batch(),
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed is False and "autograd gives `cut." in result.message, result.message


class _PaddedText(__import__("torch").nn.Module):
    """Token embeddings with a padding index (every batch pads its short sequences), mean-pooled, a
    head; ``bag``: an ``nn.EmbeddingBag`` with a padding index instead."""

    def __init__(self, bag):
        from torch import nn

        super().__init__()
        self.bag = bag
        self.embedding = (nn.EmbeddingBag(12, 8, mode="mean", padding_idx=0) if bag
                          else nn.Embedding(12, 8, padding_idx=0))
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        features = self.embedding(tokens) if self.bag else self.embedding(tokens).mean(1)
        return self.head(features)


def test_an_embeddings_padding_row_is_not_checked():
    """PyTorch gives the padding row no gradient by design, though the loss depends on it where a batch
    pads (the mean runs over padded positions): a padded text model failed, naming a custom backward as
    the cause (analytic 0 against numerical -0.014), whenever the draw of entries hit that row (here; one
    draw in four with 12 tokens, about one in twenty with a 65-character vocabulary). The other rows are
    compared; a gradient cut there still fails (the same model with the embedding detached)."""
    import torch

    torch.manual_seed(0)
    tokens = torch.randint(1, 12, (16, 6))
    tokens[:, 4:] = 0  # padded
    batch = (tokens, torch.randint(0, 3, (16,)))
    for bag in (False, True):
        result = checks.run(_PaddedText(bag), torch.nn.functional.cross_entropy, batch,
                            checks=["gradient_check"])["gradient_check"]
        assert result.passed, result.message
        assert "entries of 3 parameter tensors agree" in result.message

    class _Detached(_PaddedText):
        def forward(self, tokens):
            return self.head(self.embedding(tokens).detach().mean(1))

    result = checks.run(_Detached(False), torch.nn.functional.cross_entropy, batch,
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed is False and result.message.startswith("autograd gives `embedding.weight` no gradient")


class _ZeroInitResidual(__import__("torch").nn.Module):
    """A residual block whose last BatchNorm starts at zero (timm's ResNets, Goyal et al.'s zero-init
    residual), a ReLU after the addition, global pooling, a head."""

    def __init__(self):
        from torch import nn

        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4))
        nn.init.zeros_(self.branch[1].weight)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        h = self.stem(x)
        return self.head((h + self.branch(h)).relu().mean((2, 3)))


def test_a_zero_initialised_scale_is_compared_away_from_its_kink():
    """At zero the branch adds exactly 0 before the ReLU, whose zero inputs (the stem's ReLU zeros) any
    change of the scale moves across: every entry sits on a kink for every ε, where autograd's subgradient
    matches neither one-sided slope, and the check failed naming a custom backward (timm's ResNet-18:
    analytic -0.00029 against 0.0031). Exactly-zero tensors are compared at 1e-3 x normal values."""
    import torch

    class WithAnEmptyTensor(_ZeroInitResidual):
        """An empty parameter besides: no entry to compare, left out (the check once raised on the largest
        gradient entry of an empty tensor), and not counted as exactly zero."""

        def __init__(self):
            super().__init__()
            self.empty = torch.nn.Parameter(torch.empty(0))

        def forward(self, x):
            return super().forward(x) + self.empty.sum()

    torch.manual_seed(0)
    result = checks.run(WithAnEmptyTensor(), torch.nn.functional.cross_entropy, _digits_batch(),
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed, result.message
    assert result.message.endswith("; 3 tensors that were exactly zero compared at 0.001 x normal values")
    assert " entries of 9 parameter tensors agree" in result.message, result.message


def test_every_entry_of_tensors_of_at_most_three_entries_is_checked_and_counted():
    """``nn.Linear(3, 1)``: the weight's 3 entries and the bias's 1, each of at most ``ENTRIES`` (3) entries, so all
    are drawn: 4 entries of 2 tensors."""
    import torch

    torch.manual_seed(0)
    batch = (torch.randn(8, 3), torch.randn(8, 1))
    result = checks.run(torch.nn.Linear(3, 1), torch.nn.functional.mse_loss, batch, task="regression",
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed and result.message.startswith("4 entries of 2 parameter tensors agree"), result.message


class _Doubled(torch.autograd.Function):
    """The identity with a backward pass that doubles the gradient (a wrong custom backward)."""

    @staticmethod
    def forward(ctx, tensor):
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class _SparseWrong(torch.nn.Module):
    """A table of 200 entries of which the loss reads entry 7 alone, through ``_Doubled``."""

    def __init__(self):
        super().__init__()
        self.linear, self.table = torch.nn.Linear(3, 2), torch.nn.Parameter(torch.randn(200))

    def forward(self, x):
        return self.linear(x) * _Doubled.apply(self.table[7])


def test_a_wrong_gradient_at_the_one_entry_that_has_one_is_found():
    """The entries compared include some with a non-zero analytic gradient: entry 7 of the table, which a
    uniform draw of a few of its 200 entries would miss."""
    torch.manual_seed(0)
    batch = (torch.randn(8, 3), torch.randint(0, 2, (8,)))
    result = checks.run(_SparseWrong(), torch.nn.functional.cross_entropy, batch, checks=["gradient_check"])
    assert result["gradient_check"].passed is False and result["gradient_check"].message.startswith("`table`")


def test_the_users_random_state_is_left_alone_and_the_draws_are_the_same_in_every_run():
    """The global random state after the check is the one before, and a run after another seed compares the
    same entries (the same message and largest error); ``checks.run(seed=1)`` draws other entries."""
    torch.manual_seed(0)
    batch = (torch.randn(8, 3), torch.randint(0, 2, (8,)))
    model = torch.nn.Sequential(torch.nn.Linear(3, 40), torch.nn.Tanh(), torch.nn.Linear(40, 2))
    state = torch.get_rng_state()
    first = checks.run(model, torch.nn.functional.cross_entropy, batch, checks=["gradient_check"])["gradient_check"]
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(1)
    second = checks.run(model, torch.nn.functional.cross_entropy, batch, checks=["gradient_check"])["gradient_check"]
    assert first.passed and second.message == first.message and second.value == first.value
    other = checks.run(model, torch.nn.functional.cross_entropy, batch, checks=["gradient_check"], seed=1)
    assert other["gradient_check"].passed and other["gradient_check"].value != first.value


class _Lookup(torch.nn.Module):
    """Token ids through an embedding (``padding_idx`` given or not) or a module of its own holding a table and a
    ``padding_idx`` attribute, with a wrong backward after it."""

    def __init__(self, kind):
        super().__init__()
        if kind == "table":
            self.emb = torch.nn.Module()
            self.emb.weight, self.emb.padding_idx = torch.nn.Parameter(torch.randn(5, 4)), 0
        else:
            self.emb = torch.nn.Embedding(5, 4, padding_idx=None if kind == "embedding" else 0)
        self.kind, self.head = kind, torch.nn.Linear(4, 2)

    def forward(self, ids):
        rows = self.emb.weight[ids] if self.kind == "table" else self.emb(ids)
        return self.head(_Doubled.apply(rows).mean(1))


@pytest.mark.parametrize("kind", ["embedding", "table"])
def test_a_wrong_gradient_of_every_row_is_found_where_no_row_is_padding(kind):
    """An ``nn.Embedding`` without ``padding_idx``, and a table whose module has a ``padding_idx`` but is no
    embedding (its row 0 is an ordinary row): every row's entries may be compared, and the doubled gradient
    is found; token 0 alone is in the batch."""
    torch.manual_seed(0)
    batch = (torch.zeros(6, 3, dtype=torch.long), torch.randint(0, 2, (6,)))
    result = checks.run(_Lookup(kind), torch.nn.functional.cross_entropy, batch, checks=["gradient_check"])
    assert result["gradient_check"].passed is False and result["gradient_check"].message.startswith("`emb.weight` disagrees")


def _check(model, batch, loss_fn=torch.nn.functional.cross_entropy, **options):
    return checks.run(model, loss_fn, batch, checks=["gradient_check"], **options)["gradient_check"]


def _classes_batch(n=8, features=3, classes=2):
    torch.manual_seed(0)
    return torch.randn(n, features), torch.randint(0, classes, (n,))


class _ReadsItsScale(torch.nn.Module):
    """A zero-initialised scale; each forward pass adds the largest magnitude it has to the class's ``seen``
    (a class attribute: the model's copies share it)."""

    seen = []

    def __init__(self):
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(3, 2), torch.nn.Parameter(torch.zeros(100))

    def forward(self, x):
        type(self).seen.append(float(self.scale.detach().abs().max()))
        return self.linear(x) * (1 + self.scale.tanh().mean())


def test_a_zero_tensor_is_moved_to_a_thousandth_of_normal_values():
    """The copy's 100 entries at 1e-3 x standard normal values: none beyond 5e-3 (five sigma, plus the ε of a
    perturbed entry), some beyond 1e-3; the user's model keeps its zeros."""
    seen = _ReadsItsScale.seen = []
    model = _ReadsItsScale()
    result = _check(model, _classes_batch())
    assert result.passed and result.message.endswith("; 1 tensors that were exactly zero compared at 0.001 x normal values")
    assert seen and 1e-3 < max(seen) < 5e-3 + 2e-6, seen
    assert not bool(model.scale.any())


def test_a_loss_module_with_float32_class_weights_is_run_in_float64_on_a_copy():
    """``nn.CrossEntropyLoss(weight=...)``: its float32 buffer would not take float64 outputs; a float64 copy
    is used, and the user's loss keeps its float32 weights."""
    loss_fn = torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0]))
    result = _check(torch.nn.Linear(3, 2), _classes_batch(), loss_fn)
    assert result.passed, result.message
    assert loss_fn.weight.dtype == torch.float32


class _Float32Only(torch.nn.Linear):
    """Casts its input to float32 first: its float64 copy cannot multiply it."""

    def forward(self, x):
        return super().forward(x.float())


def test_a_model_that_cannot_run_in_float64_is_skipped_naming_the_error():
    result = _check(_Float32Only(3, 2), _classes_batch())
    assert (result.name, result.status) == ("gradient_check", "skipped")
    assert result.message.startswith("the model does not run in float64 (") and "Double" in result.message, result.message


class _NoGradient(torch.nn.Module):
    """``kind="cut"``: the output is detached from every parameter; ``"zero"``: every gradient is exactly 0."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.linear = kind, torch.nn.Linear(3, 2)

    def forward(self, x):
        out = self.linear(x)
        return out.detach() if self.kind == "cut" else out * 0 + x[:, :2]


@pytest.mark.parametrize("kind", ["cut", "zero"])
def test_without_any_nonzero_gradient_the_check_is_skipped(kind):
    result = _check(_NoGradient(kind), _classes_batch())
    assert (result.name, result.status) == ("gradient_check", "skipped")
    assert result.message == "no parameter gets a non-zero gradient (see nonzero_gradients)"


class _Scaled(torch.nn.Module):
    """Large logits (30 x a Linear layer's) and a table whose entry reaches them through ``_Doubled`` and a factor
    3e-7: its tiny gradient is doubled."""

    def __init__(self):
        super().__init__()
        self.linear, self.table = torch.nn.Linear(3, 2), torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return 30 * self.linear(x) + 3e-7 * _Doubled.apply(self.table).expand(len(x), 2) * torch.tensor([1.0, -1.0])


def test_an_error_in_a_tiny_gradient_is_judged_against_the_largest_entry():
    """``|n − a| / max(|n|, |a|, 1e-3 · g_max)``: the doubled tiny gradient's error is 6.5e-6 to 2e-5 of
    1e-3 · g_max on seeds 0-4, below the tolerance 1e-4 (against its own size it would be 0.5; against
    1e-3 / g_max, 6e-4 to 6e-3)."""
    result = _check(_Scaled(), _classes_batch())
    assert result.passed and result.value < 1e-4 / 3, result.message


class _Table(torch.nn.Module):
    """Three entries added to the logits: entry 0 through ``_Doubled`` (``wrong``) or plainly, entry 1 detached
    (``cut``) or plainly, entry 2 plainly."""

    def __init__(self, wrong=False, cut=False):
        super().__init__()
        self.wrong, self.cut = wrong, cut
        self.linear, self.table = torch.nn.Linear(3, 2), torch.nn.Parameter(torch.tensor([0.5, -0.3, 0.2]))

    def forward(self, x):
        first = _Doubled.apply(self.table[0]) if self.wrong else self.table[0]
        second = self.table[1].detach() if self.cut else self.table[1]
        return self.linear(x) * torch.stack([first + self.table[2], second]).tanh()


def test_the_errors_of_a_doubled_gradient_and_of_a_cut_entry():
    """Every entry of the 3-entry table is compared. A doubled gradient has the error ``|n − 2n| / 2|n| = 1/2``,
    named with its index, the threshold and the custom-backward fix; an entry cut from a tensor that has
    gradients elsewhere has ``|n| / |n| = 1`` and is a disagreement of ``table`` (its other entries get
    gradients), not a tensor without any. A pass states its threshold too."""
    passing = _check(_Table(), _classes_batch())
    assert passing.passed and (passing.threshold, passing.value < 1e-6) == ("<= 0.0001", True)
    doubled = _check(_Table(wrong=True), _classes_batch())
    assert doubled.passed is False and abs(doubled.value - 0.5) < 1e-6 and doubled.threshold == "<= 0.0001"
    assert doubled.message.startswith("`table` disagrees: analytic ") and doubled.message.endswith(
        " at index (0,) (error 0.5)"), doubled.message
    assert doubled.fix == ("a custom backward (torch.autograd.Function) between `table` and the loss returns a wrong "
                           "gradient: compare it with torch.autograd.gradcheck")
    cut = _check(_Table(cut=True), _classes_batch())
    assert cut.passed is False and cut.value == pytest.approx(1.0, abs=1e-12)
    assert cut.message.startswith("`table` disagrees: analytic 0 vs numerical ") and " at index (1,)" in cut.message
