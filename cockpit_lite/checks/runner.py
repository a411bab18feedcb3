"""``run``: the pre-flight checks (``CHECKS``, in order) on copies of a model, each on a forked random
state; a check that raises has not passed."""

import time

import torch

from cockpit_lite.checks import (
    batch_independence,
    causal,
    data_duplicates,
    data_imbalance,
    data_nonfinite,
    data_normalization,
    gradient_check,
    init_calibration,
    init_loss,
    input_independent_baseline,
    nonzero_gradients,
    overfit_one_batch,
)
from cockpit_lite.checks.isolation import forked_rng
from cockpit_lite.checks.problem import Problem
from cockpit_lite.checks.report import CheckResult, Report

#: name -> check function ``(Problem) -> CheckResult``, in the order ``run`` runs them.
CHECKS = {
    "init_loss": init_loss.check,
    "init_calibration": init_calibration.check,
    "batch_independence_forward": batch_independence.forward,
    "batch_independence_backward": batch_independence.backward,
    "causal_forward": causal.forward,
    "causal_backward": causal.backward,
    "nonzero_gradients": nonzero_gradients.check,
    "overfit_one_batch": overfit_one_batch.check,
    "input_independent_baseline": input_independent_baseline.check,
    "gradient_check": gradient_check.check,
    "data_duplicates": data_duplicates.check,
    "data_imbalance": data_imbalance.check,
    "data_normalization": data_normalization.check,
    "data_nonfinite": data_nonfinite.check,
}


def run(model, loss_fn, batch, task="classification", num_classes=None, data=None, sequence_dim=None, *,
        optimizer=None, checks=None, seed=0):
    """Run the pre-flight checks on copies of ``model``; return a ``Report``.

    Args:
        model: the ``nn.Module`` to check (never changed).
        loss_fn: ``loss_fn(model(x), y)`` -> scalar loss.
        batch: ``(x, y)``, one batch as the training loop would see it (batch axis 0).
        task: ``"classification"``, ``"regression"`` or ``"causal_lm"``.
        num_classes: number of classes (None: read from the output; None for regression).
        data: optional ``{"x_train", "y_train", "x_test", "y_test"}`` (tensors or arrays)
            for the data checks; without it, ``data_normalization`` and ``data_nonfinite``
            look at the batch and the other two are skipped.
        sequence_dim: the sequence axis of ``(B, T, ...)`` inputs and outputs (1 by
            default for ``causal_lm``); None: no causal checks.
        optimizer: the optimizer the training will use (read, never stepped): the
            training checks use a fresh one of the same class and hyper-parameters, and
            ``nonzero_gradients`` checks the parameters it holds. A callable
            ``params -> Optimizer`` works too. Default: Adam at a tuned learning rate.
        checks: names of the checks to run (default: all of ``CHECKS``).
        seed: seed of the checks' random draws (on a forked random state).
    """
    problem = Problem(model, loss_fn, batch, task, num_classes, data, sequence_dim, optimizer)
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise KeyError(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    results, start = [], time.perf_counter()
    for name in names:
        with forked_rng(problem.x, seed), torch.enable_grad():
            began = time.perf_counter()
            try:
                result = CHECKS[name](problem)
            except Exception as error:  # a check that cannot run the model has not passed
                result = CheckResult(name, False, None, "", f"the check raised {type(error).__name__}: {error}",
                                     "make the model, the loss and the batch work together (see the error)")
        result.seconds = time.perf_counter() - began
        results.append(result)
    return Report(results, time.perf_counter() - start)


def assert_all(model, loss_fn, batch, **options):
    """``run(...)`` and raise one ``AssertionError`` listing every failed check; return the report."""
    return run(model, loss_fn, batch, **options).raise_if_failed()
