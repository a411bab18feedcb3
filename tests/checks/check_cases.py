"""The pre-flight checks' test suite: the set-ups of ``experiments.preflight_cases`` (each on seed 0 here;
``python -m experiments.preflight --calibrate`` runs them on several seeds)."""

from experiments.preflight_cases import BROKEN, CASES, HEALTHY, digits, digits_case, mlp  # noqa: F401
