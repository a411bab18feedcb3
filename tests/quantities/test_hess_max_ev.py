"""HessMaxEV against torch.linalg.eigvalsh of the brute-force Hessian, on plain and realistic models."""

import pytest
import torch

import models
import problems
from cockpit_lite import Cockpit, configuration, schedules
from cockpit_lite.linalg import lanczos_max_eig
from cockpit_lite.quantities import HessMaxEV
from experiments.hess_max_ev_starts import Mixer

REALISTIC = ["transformer", "gpt", "resnet_bn_train", "resnet_gn", "lstm", "custom"]
"""SDPA attention (CPU flash kernel), tied head + learned positions, BatchNorm in training mode, ..."""


def reference(problem, snapshots, step):
    return torch.linalg.eigvalsh(problems.hessian(problem, snapshots[step])).max()


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_matches_eigvalsh(case):
    record = problems.check(HessMaxEV(), reference, case, rtol=1e-3, layers=False)
    assert all(entry["meta"]["HessMaxEV"]["solver"] == "lanczos" for entry in record.values())


@pytest.mark.parametrize("name", REALISTIC)
def test_matches_eigvalsh_on_realistic_models(name):
    """A cold first step, then two warm-started ones (one start vector from the previous Ritz vectors)."""
    problems.check(HessMaxEV(), reference, (name, 3, "mean"), steps=3, rtol=1e-3, layers=False)


def test_power_iteration_as_cockpit():
    """use_power=True: Cockpit's power iteration (largest |eigenvalue|, its own stopping rule)."""
    def largest_magnitude(problem, snapshots, step):
        eigenvalues = torch.linalg.eigvalsh(problems.hessian(problem, snapshots[step]))
        return eigenvalues[eigenvalues.abs().argmax()]

    record = problems.check(HessMaxEV(use_power=True, rtol=1e-6, maxiter=500), largest_magnitude,
                            ("mlp", 5, "mean"), rtol=1e-3, layers=False)
    assert all(entry["meta"]["HessMaxEV"]["solver"] == "power" for entry in record.values())


def _plain_or_create_graph(create_graph):
    """One step of the MLP problem with ``loss.backward(create_graph=create_graph)``."""
    problem = problems.make("mlp", 3, steps=1)
    snapshot = problems.Snapshot([p.detach().clone() for p in problem.model.parameters()], *problem.batches[0])
    cp = Cockpit(problem.model, [HessMaxEV(rtol=1e-10, maxiter=200)], diagnose=False)
    assert not cp.create_graph(0)
    loss = problem.lossfunc(problem.model(snapshot.x), snapshot.y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=create_graph)
    return cp.get_output()[0]["HessMaxEV"], float(reference(problem, {0: snapshot}, 0))


@pytest.mark.parametrize("create_graph", [False, True], ids=["plain", "create_graph"])
def test_a_plain_backward_suffices_and_create_graph_changes_nothing(create_graph):
    """cp.create_graph(step) is False: the products run before the user's backward; a user
    passing create_graph=True anyway gets the same λ (against eigvalsh of the autograd Hessian)."""
    value, expected = _plain_or_create_graph(create_graph)
    assert value == pytest.approx(expected, rel=1e-8)


def test_info_loss_is_required_before_backward():
    problem = problems.make("mlp", 3, steps=1)
    cp = Cockpit(problem.model, [HessMaxEV()], diagnose=False)
    with pytest.raises(ValueError, match=r"HessMaxEV needs info\['loss'\] at step 0"):
        cp(0, info={})


def _train(name, steps, level, backend=None):
    """Float32 training of a realistic model; with a Cockpit at ``level`` unless None."""
    build, loss_cls, inputs, targets = problems.BUILDERS[name]
    torch.manual_seed(0)
    model, lossfunc = build(), loss_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, configuration(level)) if level else None
    g = torch.Generator().manual_seed(1)
    flags = []
    for step in range(steps):
        x, y = inputs(g, 4).float(), targets(g, 4)
        x = x.long() if name == "gpt" else x
        opt.zero_grad()
        loss = lossfunc(model(x), y)
        if cp is None:
            loss.backward()
        else:
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward(create_graph=cp.create_graph(step))
        opt.step()
        flags.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
    return [p.detach().clone() for p in model.parameters()], cp, flags


@pytest.mark.parametrize("name", ["transformer", "gpt"])
def test_observer_effect_with_attention_is_zero_bit_for_bit(name):
    """Full configuration through F.scaled_dot_product_attention: parameters and kernel flags as without it."""
    plain, _, plain_flags = _train(name, 4, None)
    observed, cp, flags = _train(name, 4, "full")
    assert all(torch.equal(a, b) for a, b in zip(plain, observed))
    assert flags == plain_flags
    assert all(torch.isfinite(torch.tensor(cp.get_output()[s]["HessMaxEV"])) for s in range(4))


def test_attention_dropout_with_its_masks():
    """Dropout in attention: the Hessian of the loss with this step's masks (replayed by the reference)."""
    problems.check(HessMaxEV(), reference, ("transformer_dropout", 3, "mean"), steps=2, rtol=1e-3, layers=False)


def test_compiled_model_is_refused_with_the_fix():
    model = models.Encoder(0.0)
    with pytest.raises(ValueError, match="Cockpit\\(model, ...\\), and use it uncompiled on the tracked steps"):
        Cockpit(torch.compile(model), [HessMaxEV()])


class _WithUnusedLayer(torch.nn.Module):
    """A model with a tracked layer the forward pass never uses (its gradient is None)."""

    def __init__(self):
        super().__init__()
        self.first, self.unused, self.last = torch.nn.Linear(4, 3), torch.nn.Linear(2, 2), torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.last(torch.tanh(self.first(x)))


@pytest.mark.parametrize("use_power", [False, True], ids=["lanczos", "power"])
def test_unused_parameters_have_no_curvature(use_power):
    """Their Hessian rows are zero; λ from torch.linalg.eigvalsh of the autograd Hessian of all parameters."""
    torch.manual_seed(0)
    model = _WithUnusedLayer().double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randint(0, 2, (5,), generator=g)
    lossfunc = torch.nn.CrossEntropyLoss()
    cp = Cockpit(model, quantities=[HessMaxEV(use_power=use_power, rtol=1e-10, maxiter=500)], diagnose=False)
    loss = lossfunc(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=cp.create_graph(0))
    hessian = problems.hessian_of(model, lambda forward: lossfunc(forward(x), y))
    eigenvalues = torch.linalg.eigvalsh(hessian)
    expected = eigenvalues[eigenvalues.abs().argmax()] if use_power else eigenvalues.max()
    assert cp.get_output()[0]["HessMaxEV"] == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("use_power", [False, True], ids=["lanczos", "power"])
def test_maxiter_caps_the_products(use_power):
    """rtol = 0 never converges: every step stops at maxiter products and records them."""
    problem = problems.make("mlp", 5, steps=2)
    quantity = HessMaxEV(use_power=use_power, rtol=0, maxiter=3)
    assert quantity.last_iterations is None
    cp, _ = problems.run(problem, [quantity])
    assert [entry["meta"]["HessMaxEV"]["products"] for entry in cp.get_output().values()] == [3, 3]
    assert quantity.last_iterations == 3


def test_the_user_random_state_is_left_alone_and_the_seed_is_used():
    """Start vectors come from the quantity's own generator (seed 0 by default), never torch's global one."""
    def values(**kwargs):
        problem = problems.make("mlp", 5, steps=2)
        state = torch.get_rng_state()
        cp, _ = problems.run(problem, [HessMaxEV(**kwargs)])
        assert torch.equal(state, torch.get_rng_state())
        return [(entry["HessMaxEV"], entry["meta"]["HessMaxEV"]["products"]) for entry in cp.get_output().values()]

    default = values()
    assert default == values(seed=0)
    assert default != values(seed=1)


def test_a_model_with_a_single_parameter_tensor():
    """λ_max of a least-squares problem: 2 XᵀX / (B·O) for MSE on a bias-free linear layer."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2, bias=False).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, 2, generator=g, dtype=torch.float64)
    cp = Cockpit(model, quantities=[HessMaxEV(rtol=1e-10)], diagnose=False)
    loss = torch.nn.MSELoss()(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=cp.create_graph(0))
    expected = torch.linalg.eigvalsh(2 * x.T @ x / y.numel()).max()  # each output row: 2 XᵀX / (B·O)
    assert cp.get_output()[0]["HessMaxEV"] == pytest.approx(float(expected), rel=1e-8)


@pytest.mark.parametrize("marker,hint", [("donated buffer", "torch.compile"), ("scaled_dot_product", "sdpa_kernel")])
def test_known_double_backward_failures_get_their_fix(monkeypatch, marker, hint):
    import cockpit_lite.quantities.hess_max_ev as module

    def fail(*args, **kwargs):
        raise RuntimeError(f"something about the {marker} went wrong")

    monkeypatch.setattr(module, "lanczos_max_eig", fail)
    problem = problems.make("mlp", 3, steps=1)
    with pytest.raises(RuntimeError, match=rf"HessMaxEV at step 0: .*{hint}.*\(something about the {marker} went wrong\)$") as raised:
        problems.run(problem, [HessMaxEV()])
    other = "sdpa_kernel" if hint == "torch.compile" else "donated buffers"
    assert other not in str(raised.value)


def test_other_runtime_errors_pass_unchanged(monkeypatch):
    import cockpit_lite.quantities.hess_max_ev as module

    def fail(*args, **kwargs):
        raise RuntimeError("an unrelated failure")

    monkeypatch.setattr(module, "lanczos_max_eig", fail)
    with pytest.raises(RuntimeError, match="^an unrelated failure$"):
        problems.run(problems.make("mlp", 3, steps=1), [HessMaxEV()])


def test_schedule_and_verbose_are_passed_on(capsys):
    """track_schedule and verbose reach the base class: values (and a printed line) at steps 0 and 2 only."""
    problems.check(HessMaxEV(track_schedule=schedules.linear(2), verbose=True), reference, ("mlp", 5, "mean"),
                   steps=4, rtol=1e-3, layers=False, schedule_steps=[0, 2])
    printed = [line for line in capsys.readouterr().out.splitlines() if "HessMaxEV" in line]
    assert len(printed) == 2 and "step 0]" in printed[0] and "step 2]" in printed[1]
    problems.check(HessMaxEV(), reference, ("mlp", 2, "mean"), steps=1, rtol=1e-3, layers=False)
    assert "HessMaxEV" not in capsys.readouterr().out


def test_declares_its_products_in_its_needs():
    """What a step needs is read from Needs (the overhead budget's tiers): HessMaxEV asks for
    Hessian-vector products."""
    from cockpit_lite.budget import tier_of

    quantity = HessMaxEV()
    needs = quantity._needs(0, None)
    assert needs.hvp and tier_of(needs) == 2


def test_a_close_second_eigenvalue_on_a_mixer():
    """Seed 3 starts plain Lanczos (block=1) with a small component along the top eigenvector:
    it stops at the second eigenvalue, 0.7% low. The default block of two starts finds λ_max
    there, and from the starts of seeds 0-15, 42 and 47 (over seeds 0-399: one start
    misses 21, two 2).
    Reference: eigvalsh of the float64 autograd Hessian."""
    torch.manual_seed(1)
    model = Mixer().double()  # (its head started small: the top two eigenvalues 1.0933 and 1.0855, 0.7% apart)
    x = torch.randn(8, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.arange(8) % 4
    names, params = zip(*model.named_parameters())
    sizes = [p.numel() for p in params]

    def loss_of(flat):
        tensors = {n: v.reshape(p.shape) for n, v, p in zip(names, flat.split(sizes), params)}
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, tensors, (x,)), y)

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hessian = torch.autograd.functional.hessian(loss_of, flat, vectorize=True)
    exact = float(torch.linalg.eigvalsh(hessian).max())
    for block in (2, 1):
        cp = Cockpit(model, quantities=[HessMaxEV(seed=3, block=block)], diagnose=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(0, info={"loss": loss}):
            loss.backward(create_graph=cp.create_graph(0))
        model.zero_grad(set_to_none=True)
        value = cp.get_output()[0]["HessMaxEV"]
        assert (abs(value - exact) <= 1e-3 * exact) == (block == 2), (block, value, exact)
    for seed in (*range(16), 42, 47):  # the quantity's starts: two draws of its generator seeded with seed
        generator = torch.Generator().manual_seed(seed)
        starts = torch.stack([torch.randn(flat.numel(), generator=generator, dtype=torch.float64) for _ in range(2)])
        value, _, _ = lanczos_max_eig(lambda v: hessian @ v, starts)
        assert abs(float(value) - exact) <= 1e-3 * exact, seed
        if seed in (3, 42, 47):
            single, _, _ = lanczos_max_eig(lambda v: hessian @ v, starts[0])
            assert float(single) < (1 - 5e-3) * exact, seed


@pytest.mark.parametrize("block", [1, 2, 3, None], ids=["1", "2", "3", "default"])
def test_a_cold_start_has_block_vectors_and_a_warm_start_one(monkeypatch, block):
    """Step 0 starts from ``block`` noise vectors (by default 2); every later step from one vector, the previous
    step's top Ritz vectors (``keep=3``) mixed with noise, whose value still matches eigvalsh."""
    import cockpit_lite.quantities.hess_max_ev as module

    seen = []  # (start vectors, cosine of the first with the previous step's Ritz vectors' sum)

    def spy(matvec, starts, *args, **kwargs):
        previous = quantity._previous
        cosine = None if previous is None else float(
            torch.nn.functional.cosine_similarity(starts[0], previous.sum(0), dim=0))
        seen.append((starts.shape[0], cosine))
        return lanczos_max_eig(matvec, starts, *args, **kwargs)

    monkeypatch.setattr(module, "lanczos_max_eig", spy)
    quantity = HessMaxEV() if block is None else HessMaxEV(block=block)
    problems.check(quantity, reference, ("mlp", 4, "mean"), steps=3, rtol=1e-3, layers=False)
    assert [rows for rows, _ in seen] == [block or 2, 1, 1] and seen[0][1] is None
    assert all(0.9 < cosine < 0.99 for _, cosine in seen[1:])  # 1/√(1 + 0.3²) = 0.958: warm, with noise


@pytest.mark.parametrize("block", [0, -1, 1.5])
def test_block_must_be_a_positive_integer(block):
    with pytest.raises(ValueError, match="block must be a positive integer"):
        HessMaxEV(block=block)


def test_the_default_cap_is_100_products():
    """rtol = 0 on a model of 421 parameters (its Krylov space is not exhausted first): the step stops at the
    default ``maxiter``, 100 products."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    x, y = torch.randn(8, 20), torch.randint(0, 5, (8,))
    cp = Cockpit(model, [HessMaxEV(rtol=0)], diagnose=False)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.get_output()[0]["meta"]["HessMaxEV"]["products"] == 100
