"""The same numbers as the original Cockpit (skipped when cockpit-for-pytorch is not installed)."""

import pytest

pytest.importorskip("cockpit", reason="cockpit-for-pytorch is not installed")

from experiments import compare_with_cockpit as peer  # noqa: E402


@pytest.mark.parametrize("problem", peer.PROBLEMS, ids=lambda p: "-".join(map(str, p)))
def test_every_shared_quantity_matches_cockpit(problem):
    errors = peer.compare(*problem, steps=3)
    for name in peer.SHARED:
        assert errors[name] <= peer.TOLERANCE, f"{name}: relative difference {errors[name]:.2e}"
    # λ_max: ours is exact to Lanczos' tolerance; Cockpit's power iteration may stop early
    assert errors["HessMaxEV vs exact"] <= 1e-3
