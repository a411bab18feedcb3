"""``Output``: one value of a quantity, as ``Quantity.compute`` returns it (and the subsampled estimators
of ``cockpit_lite.subsample`` form it)."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Output:
    """One value of a quantity.

    Attributes:
        value: the value in Cockpit's layout (tensors allowed).
        layers: per-layer values (one per tracked parameter), or None.
        step: the step to record it under (default: the current step).
        flags: strings describing problems with this value.
        meta: how the value was obtained (a dict, tensors allowed; e.g. the method,
            probe count and standard error of an estimate), recorded under
            ``record[step]["meta"][name]``; or None.
    """

    value: Any
    layers: Optional[list] = None
    step: Optional[int] = None
    flags: list = field(default_factory=list)
    meta: Optional[dict] = None
