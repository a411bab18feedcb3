"""The pre-flight checks' test suite: the set-ups of ``experiments.preflight_cases`` (each on seed 0 here;
``python -m experiments.preflight --calibrate`` runs them on several seeds), and a model of the tests' own."""

import torch

from experiments.preflight_cases import BROKEN, CASES, HEALTHY, digits, digits_case, mlp  # noqa: F401


class TokenTable(torch.nn.Module):
    """Token ids read by a table of the model's own (5 tokens, 3 outputs): no ``nn.Embedding`` consumes them."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(5, 3))

    def forward(self, ids):
        return self.table[ids]
