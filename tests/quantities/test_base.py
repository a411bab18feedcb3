"""``quantities.base``: the step that ``SingleStepQuantity.needs`` passes on to a quantity's ``_needs``
(the hook a custom quantity overrides, docs/quantities.md)."""

import torch

from cockpit_lite import Cockpit
from cockpit_lite.quantities import Output, SingleStepQuantity


class StepsSeen(SingleStepQuantity):
    """Due on odd steps; keeps the steps its ``_needs`` is given."""

    def __init__(self):
        super().__init__(track_schedule=lambda step: step % 2 == 1)
        self.seen = []

    def _needs(self, step, info):
        self.seen.append(step)
        return super()._needs(step, info)

    def compute(self, step, data):
        return Output(torch.tensor(0.0))


def test_needs_passes_the_due_step_to_a_custom_quantity(capsys):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    quantity = StepsSeen()
    cp = Cockpit(model, [quantity])
    for step in range(6):
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    assert quantity.seen == [1, 3, 5]
    assert capsys.readouterr().out == ""  # (a custom quantity is not verbose by default)


def test_a_quantity_written_for_the_original_cockpit_is_refused_naming_the_fix():
    """``_compute`` and ``extensions`` (the original Cockpit's interface, never called here) are refused when the
    class is made; the fix, ``needs`` and ``compute``, is the form ``StepsSeen`` above has."""
    import pytest

    with pytest.raises(TypeError, match=r"^CockpitStyle defines _compute, extensions: methods of the original "
                                        r"Cockpit's .*Fix: declare what a step needs in needs\(step, info\)"):
        type("CockpitStyle", (SingleStepQuantity,), {"_compute": lambda self, *a: None, "extensions": lambda self, s: []})


def test_the_input_of_a_module_list_the_loop_calls_in_turn_is_its_first_members():
    """``input_module``: a ``ModuleList`` is never called itself; ``InputStats`` reads the first member's input
    (the batch), not the second's."""
    import pytest

    from cockpit_lite.quantities import InputStats

    torch.manual_seed(0)
    parts = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)])
    cp = Cockpit(parts, [InputStats()], diagnose=False)
    x = 3 + torch.randn(8, 4)
    loss = parts[1](parts[0](x)).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.output[0]["InputStats"]["mean"] == pytest.approx(x.double().mean().item(), rel=1e-6)


def test_the_engine_watches_a_forward_pass_only_for_a_due_quantity_with_transforms():
    """``observes``: a quantity with per-sample transforms at a step where it is not due, and a due one without
    transforms (``Loss``), need no watched forward pass."""
    from cockpit_lite.quantities import Loss, NormTest

    norm_test = NormTest(track_schedule=lambda step: step == 2)
    assert [norm_test.observes(step) for step in range(4)] == [False, False, True, False]
    assert not Loss().observes(0)
