"""``Finding``: one problem the diagnosis found, in words and numbers."""

from dataclasses import asdict, dataclass, field
from typing import Optional

KINDS = (
    "lr_too_high", "lr_too_low", "exploding_gradients", "vanishing_gradients", "dead_relu",
    "saturated_activations", "unnormalized_inputs", "missing_zero_grad", "shuffled_labels",
    "nan_loss", "noise_dominates", "edge_of_stability", "overfitting",
)
"""The vocabulary of ``Finding.kind``."""

SEVERITIES = ("info", "warning", "error")
"""``error``: breaks training (it cannot recover by itself); ``warning``: costs accuracy or time;
``info``: an oddity worth knowing that costs nothing. A healthy run has no warning or error."""


@dataclass
class Finding:
    """A diagnosis finding.

    Attributes:
        kind: one of ``KINDS``.
        layer: a module name from ``model.named_modules()``, ``"loss_fn"`` for the loss,
            or ``None`` for a run- or data-level finding.
        step: the first step it was seen at.
        severity: ``"error"`` (breaks training: it cannot recover by itself), ``"warning"`` (costs
            accuracy or time) or ``"info"`` (an oddity that costs nothing), see ``SEVERITIES``.
        message: one plain sentence with the evidence (numbers, layer, step).
        suggestion: one line: the fix a person would make.
        evidence: the numbers behind it.
    """

    kind: str
    layer: Optional[str]
    step: int
    severity: str
    message: str
    suggestion: str
    evidence: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def key(self):
        """``(kind, layer)``: a finding is reported once per key."""
        return self.kind, self.layer

    def to_dict(self):
        """Plain JSON-able dict (as written to the log's ``"findings"`` key)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**{k: data.get(k) for k in ("kind", "layer", "step", "severity", "message", "suggestion")},
                   evidence=dict(data.get("evidence") or {}))

    def __str__(self):
        where = f" [{self.layer}]" if self.layer is not None else ""
        return f"step {self.step} {self.severity.upper()} {self.kind}{where}: {self.message} -> {self.suggestion}"
