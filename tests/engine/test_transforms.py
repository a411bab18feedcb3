"""Per-sample primitives: the factored (ghost) forms against explicit individual gradients."""

import pytest
import torch

import problems
from cockpit_lite.engine import per_sample as per_sample_module, transforms
from cockpit_lite.quantities import Alpha, GradVariance, InnerTest, NormTest, OrthoTest

B, O, I = 5, 3, 4


def factored_and_explicit(positions, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, positions, I, generator=g, dtype=torch.float64)
    delta = torch.randn(B, positions, O, generator=g, dtype=torch.float64)
    param = torch.zeros(O, I, dtype=torch.float64)
    explicit = torch.stack([sum(torch.outer(delta[n, l], a[n, l]) for l in range(positions)) for n in range(B)])
    return (
        per_sample_module.PerSample(param, 0, factors=(a, delta)),
        per_sample_module.PerSample(param, 0, grad_batch=explicit),
        explicit.reshape(B, -1),
    )


@pytest.mark.parametrize("positions", [1, 7])
def test_factored_primitives_equal_explicit_individual_gradients(positions):
    factored, materialised, flat = factored_and_explicit(positions)
    vector = torch.randn(O * I, dtype=torch.float64)
    for per_sample in (factored, materialised):
        torch.testing.assert_close(per_sample.grad, flat.sum(0))
        torch.testing.assert_close(per_sample.dots(vector), flat @ vector)
        torch.testing.assert_close(per_sample.squared_norms(), (flat**2).sum(1))
        torch.testing.assert_close(per_sample.sum_of_squares(), (flat**2).sum(0))
    torch.testing.assert_close(factored.grad_batch.reshape(B, -1), flat)


def test_transforms_scale_contributions_to_individual_gradients():
    """g̃_n = B · grad_batch[n]."""
    _, per_sample, flat = factored_and_explicit(2)
    individual = B * flat
    g = individual.mean(0)
    torch.testing.assert_close(transforms.BatchL2()(per_sample), (individual**2).sum(1))
    torch.testing.assert_close(transforms.BatchDotGrad()(per_sample), individual @ g)
    torch.testing.assert_close(transforms.SumGradSquared()(per_sample).reshape(-1), (individual**2).sum(0))
    torch.testing.assert_close(transforms.IndividualSquares()(per_sample).reshape(B, -1), individual**2)
    direction = torch.randn(O * I, dtype=torch.float64)
    dot = transforms.BatchDotDirection("d", lambda ps: direction)
    torch.testing.assert_close(dot(per_sample), individual @ direction)


def test_histograms_run_after_the_cheap_transforms():
    factored, _, _ = factored_and_explicit(1)
    order = []

    class Spy(transforms.GradHistogram1d):
        def __call__(self, per_sample):
            order.append(("hist", "grad_batch" in vars(per_sample)))
            return super().__call__(per_sample)

    class Norms(transforms.BatchL2):
        def __call__(self, per_sample):
            order.append(("norms", "grad_batch" in vars(per_sample)))
            return super().__call__(per_sample)

    transforms.run([Spy(10, (-1, 1)), Norms()], factored)
    assert order == [("norms", False), ("hist", False)]


def test_batched_histograms_equal_one_call_per_parameter(monkeypatch):
    """Small parameters wait in the batch; their values equal the direct calls once it computes."""
    monkeypatch.setattr(transforms, "BATCH_FLUSH_ELEMENTS", 3 * B * O * I)
    hist = transforms.GradHistogram1d(20, (-1, 1))
    batch = transforms.Batch()
    explicit, results = [], []
    for seed in range(7):
        _, per_sample, _ = factored_and_explicit(1, seed=seed)
        results.append(transforms.run([hist, transforms.BatchL2()], per_sample, batch))
        explicit.append(per_sample)
        assert transforms.BatchL2.key in results[-1]
        assert (hist.key in results[-1]) == (seed % 3 == 2)  # full after every third parameter
    batch.flush()
    for per_sample, result in zip(explicit, results):
        for value, expected in zip(result[hist.key], hist(per_sample)):
            torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_large_parameters_skip_the_batch(monkeypatch):
    monkeypatch.setattr(transforms, "BATCH_ELEMENTS", B * O * I - 1)
    _, per_sample, _ = factored_and_explicit(1)
    hist = transforms.GradHistogram1d(20, (-1, 1))
    assert hist.key in transforms.run([hist], per_sample, transforms.Batch())


@pytest.mark.parametrize("range_", [(-1, 1), (0.25, 1)], ids=["zero inside", "zero clipped"])
def test_histogram_leaves_out_zero_rows_exactly(range_):
    """Rows of switched-off units are counted as zeros without being built; 0 · ∞ still counts as NaN."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(B, 1, I, generator=g, dtype=torch.float64)
    a[1, 0, 2] = float("inf")  # sample 1: all its rows must be built
    delta = torch.randn(B, 1, O, generator=g, dtype=torch.float64)
    delta[delta < 0.3] = 0.0
    param = torch.zeros(O, I, dtype=torch.float64)
    factored = per_sample_module.PerSample(param, 0, factors=(a, delta))
    explicit = torch.einsum("nlo,nli->noi", delta, a)
    left_out = int((delta[[0, 2, 3, 4]] == 0).sum()) * I
    zeros, chunks = per_sample_module.PerSample(param, 0, factors=(a, delta)).nonzero_element_chunks(max_elements=2 * I)
    assert zeros == left_out > 0 and sum(c.numel() for c in chunks) == explicit.numel() - left_out

    hist = transforms.GradHistogram1d(8, range_)
    expected = hist(per_sample_module.PerSample(param, 0, grad_batch=explicit))
    for value, reference in zip(hist(factored), expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)
    assert expected[2] == O  # every product with the infinite input: ±∞, or NaN where δ = 0


def _uses(seed=3):
    """Three uses of one [O, I] parameter in the three forms (factors with positions, rows, grad_batch)
    and their explicit sum."""
    g = torch.Generator().manual_seed(seed)
    param = torch.zeros(O, I, dtype=torch.float64)
    a, delta = torch.randn(B, 6, I, generator=g, dtype=torch.float64), torch.randn(B, 6, O, generator=g, dtype=torch.float64)
    samples, index = torch.tensor([0, 0, 2, 4]), torch.tensor([1, 2, 1, 0])
    values = torch.randn(4, I, generator=g, dtype=torch.float64)
    dense = torch.randn(B, O, I, generator=g, dtype=torch.float64)
    explicit = torch.einsum("nlo,nli->noi", delta, a) + dense
    explicit[samples, index] += values
    parts = [per_sample_module.PerSample(param, 0, factors=(a, delta)), per_sample_module.PerSample(param, 0, grad_batch=dense),
             per_sample_module.PerSample(param, 0, rows=(values, samples, index, B))]
    return per_sample_module.PerSample(param, 0, parts=parts), explicit


def test_the_uses_of_a_parameter_sum_without_being_formed_first():
    """The ``parts`` form (a tied embedding and head): every primitive is that of the explicit sum,
    ``select`` of indices or of a slice keeps the form, and forming it never changes a part."""
    summed, explicit = _uses()
    flat = explicit.reshape(B, -1)
    vector = torch.randn(O * I, dtype=torch.float64)
    torch.testing.assert_close(summed.sample_sum(), flat.sum(0))
    assert summed.held_elements() == B * 6 * (I + O) + B * O * I + 4 * I + 8
    for rows in (torch.tensor([1, 4]), slice(2, 5)):
        part = summed.select(rows)
        assert part._parts is not None and part.num_samples == len(flat[rows])
        torch.testing.assert_close(part.grad, flat.sum(0))  # the gradient of all samples
        torch.testing.assert_close(part.squared_norms(), (flat[rows] ** 2).sum(1))
    torch.testing.assert_close(summed.dots(vector), flat @ vector)
    torch.testing.assert_close(summed.sum_of_squares(), (flat**2).sum(0))
    torch.testing.assert_close(torch.cat(list(summed.element_chunks(max_elements=O * I))), explicit)
    torch.testing.assert_close(summed.compact().grad_batch, explicit)  # the parts were only read
    dense = torch.zeros(B, O, I, dtype=torch.float64)
    torch.testing.assert_close(summed.compact().add_to(dense), explicit)


def test_selected_samples_of_the_rows_form_are_those_of_the_explicit_individual_gradients():
    """A run of samples (``sample_chunks``' slices) takes its entries as one range of the sorted
    rows; indices pick theirs; a sample without rows selects zeros."""
    param = torch.zeros(O, I, dtype=torch.float64)
    samples, index = torch.tensor([0, 0, 2, 4]), torch.tensor([1, 2, 1, 0])
    values = torch.randn(4, I, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    explicit = torch.zeros(B, O, I, dtype=torch.float64)
    explicit[samples, index] = values
    rows = per_sample_module.PerSample(param, 0, rows=(values, samples, index, B))
    for chosen in (slice(1, 2), slice(2, 5), slice(3, None), slice(-4, -1), slice(0, B), torch.tensor([1, 2, 4])):
        part = rows.select(chosen)
        assert part._rows is not None and part.num_samples == len(explicit[chosen])
        torch.testing.assert_close(part.grad_batch, explicit[chosen], rtol=0, atol=0)


@pytest.mark.parametrize("form", ["factors", "parts"])
def test_transforms_of_large_individual_gradients_run_on_chunks_of_samples(monkeypatch, form):
    """Beyond ``GRAD_BATCH_ELEMENTS`` a ``grad_batch`` that would have to be built is never built
    whole: the transforms see chunks of samples and combine them into the values of the explicit
    individual gradients, though each chunk is built where the one before it was (``Scratch``)
    and what a transform keeps (``keep``) outlives them."""
    if form == "factors":
        per_sample, _, flat = factored_and_explicit(7)
        explicit = flat.reshape(B, O, I)
    else:
        per_sample, explicit = _uses()
        flat = explicit.reshape(B, -1)
    monkeypatch.setattr(per_sample_module, "GRAD_BATCH_ELEMENTS", 2 * O * I)  # chunks of two samples
    chunks, whole = [], per_sample_module.PerSample.sample_chunks

    memory = set()

    def spied(self, scratch=None):
        for chunk in whole(self, scratch):
            chunks.append(chunk.num_samples)
            yield chunk
            memory.add(chunk.grad_batch.data_ptr())

    monkeypatch.setattr(per_sample_module.PerSample, "sample_chunks", spied)
    kept = {}
    direction = torch.randn(O * I, dtype=torch.float64)
    histogram = transforms.GradHistogram1d(5, (-3.0, 3.0))
    chosen = [transforms.BatchL2(), transforms.GradL2(), transforms.BatchDotGrad(), transforms.SumGradSquared(),
              transforms.SumGrad(), transforms.IndividualSquares(), histogram,
              transforms.BatchDotDirection("d", lambda p: direction, keep=kept)]
    values = transforms.run(chosen, per_sample)
    assert chunks == [2, 2, 1] and "grad_batch" not in vars(per_sample)  # never all B samples at once
    assert len(memory) == 1  # every chunk built in the same memory
    individual, g = B * flat, flat.sum(0)
    torch.testing.assert_close(values["batch_l2"], (individual**2).sum(1))
    torch.testing.assert_close(values["grad_l2"], (g**2).sum())
    torch.testing.assert_close(values["batch_dot_grad"], individual @ g)
    torch.testing.assert_close(values["sum_grad_squared"], (individual**2).sum(0).reshape(O, I))
    torch.testing.assert_close(values["sum_grad"], individual.sum(0).reshape(O, I))
    torch.testing.assert_close(values["individual_squares"], (individual**2).reshape(B, O, I))  # not the scratch's
    of_explicit = histogram(per_sample_module.PerSample(per_sample.param, 0, grad_batch=explicit))
    for value, expected in zip(values[histogram.key], of_explicit):
        torch.testing.assert_close(value, expected)
    torch.testing.assert_close(values["d"], torch.zeros(B, dtype=torch.float64))  # kept: projected later
    torch.testing.assert_close(transforms.dots_of_kept(kept[0], direction), individual @ direction)


def test_parameters_sharing_a_scratch_each_get_their_own_values(monkeypatch):
    """A step's parameters build their chunks in one ``Scratch``: each parameter's values are those
    of its own explicit individual gradients, not of the chunk built there last."""
    monkeypatch.setattr(per_sample_module, "GRAD_BATCH_ELEMENTS", 2 * O * I)
    scratch, chosen = per_sample_module.Scratch(), [transforms.BatchL2(), transforms.SumGradSquared(), transforms.SumGrad()]
    cases = [factored_and_explicit(7, seed)[::2] for seed in (1, 2)] + [_uses()]
    values = [transforms.run(chosen, per_sample, scratch=scratch) for per_sample, _ in cases]
    for (_, explicit), value in zip(cases, values):
        flat = explicit.reshape(B, -1)
        torch.testing.assert_close(value["batch_l2"], B**2 * (flat**2).sum(1))
        torch.testing.assert_close(value["sum_grad_squared"].reshape(-1), B**2 * (flat**2).sum(0))
        torch.testing.assert_close(value["sum_grad"].reshape(-1), B * flat.sum(0))


def test_chunks_of_samples_give_the_gradient_their_sums_add_up_to(monkeypatch):
    """When no transform of the samples reads ``g`` while the chunks go by (a transform of ``g`` alone,
    ``GradL2``, runs after them, on their sums), the parameter's gradient (which the check against
    autograd reads) is the sum of the chunks' own sums: the factors' product over all positions,
    the work of the layer's weight gradient again, is never formed."""
    per_sample, _, flat = factored_and_explicit(7)
    monkeypatch.setattr(per_sample_module, "GRAD_BATCH_ELEMENTS", 2 * O * I)

    def no_product(*factors):
        raise AssertionError("the gradient was formed from the factors")

    monkeypatch.setattr(per_sample_module, "_positions", no_product)
    chosen = [transforms.BatchL2(), transforms.GradL2(), transforms.SumGradSquared(), transforms.SumGrad()]
    values = transforms.run(chosen, per_sample)
    torch.testing.assert_close(per_sample.grad, flat.sum(0))
    torch.testing.assert_close(values["sum_grad"], B * flat.sum(0).reshape(O, I))
    torch.testing.assert_close(values["grad_l2"], (flat.sum(0) ** 2).sum())


def test_chunks_are_cache_sized_on_the_cpu_only():
    """On the CPU a chunk holds at most ``CPU_GRAD_BATCH_ELEMENTS`` elements; elsewhere ``GRAD_BATCH_ELEMENTS``."""
    assert per_sample_module.grad_batch_elements(torch.device("cpu")) == per_sample_module.CPU_GRAD_BATCH_ELEMENTS
    assert per_sample_module.grad_batch_elements(torch.device("cuda")) == per_sample_module.GRAD_BATCH_ELEMENTS
    assert per_sample_module.CPU_GRAD_BATCH_ELEMENTS < per_sample_module.GRAD_BATCH_ELEMENTS


def _one_sample_chunks(monkeypatch):
    """Every individual-gradient chunk one sample; returns the list the chunked forms are noted in."""
    monkeypatch.setattr(per_sample_module, "GRAD_BATCH_ELEMENTS", 1)
    forms, whole = [], per_sample_module.PerSample.sample_chunks

    def spied(self, scratch=None):
        forms.append("parts" if self._parts is not None else "factors")
        yield from whole(self, scratch)

    monkeypatch.setattr(per_sample_module.PerSample, "sample_chunks", spied)
    return forms


@pytest.mark.parametrize("case", [("gpt", 4, "mean"), ("gpt", 4, "sum"), ("transformer", 4, "sum"),
                                  ("vit_like", 4, "mean")], ids=problems.case_id)
def test_chunks_of_samples_on_realistic_models_match_brute_force(monkeypatch, case):
    """Every sequence layer (and the GPT's tied embedding and head, summed from its uses' own forms)
    in chunks of one sample: the quantities equal their brute-force float64 references."""
    from quantities import test_alpha, test_grad_variance, test_inner_test, test_norm_test, test_ortho_test

    forms = _one_sample_chunks(monkeypatch)
    for quantity, reference, layers in [(NormTest, test_norm_test.reference, True),
                                        (InnerTest, test_inner_test.reference, True),
                                        (OrthoTest, test_ortho_test.reference, True),
                                        (GradVariance, test_grad_variance.reference, False)]:
        problems.check(quantity(), reference, case, layers=layers)
    problems.check(Alpha(), test_alpha.reference, case, steps=4, layers=False, schedule_steps=[0, 1, 2])
    assert "factors" in forms and (case[0] != "gpt" or "parts" in forms)


def test_chunks_of_a_tied_gpt_under_bf16_autocast_match_brute_force(monkeypatch):
    """The parts form and chunks of one sample under bf16 autocast (float32 statistics of bf16
    operands): GradVariance of a tied GPT against a loop of autograd.grad over the samples' token
    losses of the same autocast forward pass (2 %, the engine reading float32 inputs where
    autograd's weight gradient uses their bf16 casts, as in the engine's own autocast test)."""
    import models
    from torch.nn import functional as F

    from cockpit_lite import Cockpit

    forms = _one_sample_chunks(monkeypatch)
    torch.manual_seed(0)
    model = models.GPT()
    cp = Cockpit(model, [GradVariance()], strict=True, diagnose=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, models.VOCAB, (6, models.SEQ), generator=g), torch.randint(0, models.VOCAB, (6, models.SEQ), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = models.TokenCrossEntropy()(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    per_token = F.cross_entropy(logits.reshape(-1, models.VOCAB).float(), y.reshape(-1), reduction="none")
    losses = per_token.reshape(6, -1).mean(1)  # each sample's mean token loss: g̃_n = ∇ℓ_n
    params = list(model.parameters())
    individual = [torch.autograd.grad(l, params, retain_graph=True) for l in losses]
    expected = [torch.stack(v).double().reshape(6, -1).var(0).sum() for v in zip(*individual)]
    torch.testing.assert_close(torch.tensor(cp.get_output()[0]["GradVariance"], dtype=torch.float64),
                               torch.stack(expected), rtol=2e-2, atol=1e-7)
    assert "factors" in forms and "parts" in forms


@pytest.mark.parametrize("positions", [1, 7])
def test_the_check_of_factors_is_a_sketch_of_their_sum_that_measures_a_difference(positions):
    """``PerSample.check`` of factors: ``value = project(Σ_n grad_batch[n])`` exactly (float64),
    and for ``G = Σ_n grad_batch[n] − E`` the distance ``‖value − project(G)‖`` estimates ``‖E‖``:
    its mean square over many sketches is ``‖E‖²``, and a difference as large as the sum (a
    wrong capture) never looks smaller than the check's tolerance (1e-3 of it) in 4000 sketches."""
    factored, _, flat = factored_and_explicit(positions)
    total = flat.sum(0).reshape(O, I)
    generator = torch.Generator().manual_seed(0)
    value, project = factored.check(generator)
    assert project is not None and value.shape == (per_sample_module.SKETCH_RANK,)
    torch.testing.assert_close(value, project(total))
    g = torch.Generator().manual_seed(1)
    spread = torch.randn(O, I, generator=g, dtype=torch.float64)
    rank_one = torch.outer(torch.randn(O, generator=g, dtype=torch.float64), torch.randn(I, generator=g, dtype=torch.float64))
    for error in (spread, rank_one):
        error = error * total.norm() / error.norm()
        squares = []
        for _ in range(4000):
            value, project = factored.check(generator)
            squares.append(float(((value - project(total - error)) ** 2).sum()))
        squares = torch.tensor(squares)
        mean, se = float(squares.mean()), float(squares.std() / len(squares) ** 0.5)
        assert abs(mean - float(error.norm()) ** 2) < 4 * se, (mean, float(error.norm()) ** 2, se)
        assert float(squares.sqrt().min()) > 1e-3 * float(error.norm())


def test_a_subsample_takes_its_gradient_and_its_check_from_all_samples_when_read():
    """``select`` forms no sum: the rows' ``grad`` is that of all samples once read (or the one
    set before, which then stands alone), and their ``check`` is that of all samples."""
    factored, _, flat = factored_and_explicit(7)
    part = factored.select(torch.tensor([1, 3]))
    assert part._grad is None and factored._grad is None
    value, project = part.check(torch.Generator().manual_seed(0))
    torch.testing.assert_close(value, project(flat.sum(0).reshape(O, I)))
    torch.testing.assert_close(part.grad, flat.sum(0))
    assert part._whole is None  # read: the samples it came from are let go
    other = factored_and_explicit(7)[0].select(slice(0, 2))
    given = torch.randn(O * I, dtype=torch.float64)
    other.grad = given
    assert other._whole is None and torch.equal(other.grad, given)
    value, project = other.check(None)
    assert value is other.grad and project is None  # a gradient set is compared whole


def test_sketches_of_a_parameters_uses_in_any_form_add_up_to_the_sketch_of_their_sum():
    """``PerSample.sketch`` with the same generator state draws the same projections for every form,
    so a tied head's factors and the embedding's rows are checked by the sum of their sketches."""
    g = torch.Generator().manual_seed(3)
    vocab, d = 6, 4
    a = torch.randn(B, 5, d, generator=g, dtype=torch.float64)
    delta = torch.randn(B, 5, vocab, generator=g, dtype=torch.float64)
    param = torch.zeros(vocab, d, dtype=torch.float64)
    head = per_sample_module.PerSample(param, 0, factors=(a, delta))
    samples, index = torch.tensor([0, 0, 2, 4]), torch.tensor([1, 5, 1, 0])
    values = torch.randn(4, d, generator=g, dtype=torch.float64)
    embedding = per_sample_module.PerSample(param, 0, rows=(values, samples, index, B))
    total = head.grad_batch.sum(0) + embedding.grad_batch.sum(0)
    (first, project), (second, _) = (p.sketch(torch.Generator().manual_seed(7)) for p in (head, embedding))
    torch.testing.assert_close(first + second, project(total))
    assert not torch.allclose(first, project(total))


@pytest.mark.parametrize("shape", [(), (3,), (4, 3), (2, 3, 2, 2)], ids=str)
def test_zero_individual_gradients_give_the_values_of_explicit_zeros(shape):
    """``PerSample.zeros`` (a parameter the loss does not reach: no ``[K, *shape]`` tensor formed) against
    an explicit ``[K, *shape]`` tensor of zeros, for every transform."""
    param = torch.randn(shape, dtype=torch.float64)
    every = [transforms.BatchL2(), transforms.GradL2(), transforms.SumGradSquared(), transforms.SumGrad(),
             transforms.IndividualSquares(), transforms.BatchDotGrad(),
             transforms.GradHistogram1d(8, (-1, 1)), transforms.GradHistogram2d((4, 5), ((-1, 1), (-2, 2)))]
    PerSample = per_sample_module.PerSample
    cheap = transforms.run(every, PerSample.zeros(param, 0, 5, batch_size=7))
    dense = transforms.run(every, PerSample(param, 0, grad_batch=torch.zeros(5, *shape, dtype=torch.float64), batch_size=7))
    for t in every:
        for got, expected in zip(*(v if isinstance(v, tuple) else (v,) for v in (cheap[t.key], dense[t.key]))):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
