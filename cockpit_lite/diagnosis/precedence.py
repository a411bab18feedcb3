"""Cause before symptom: the order in which findings are reported.

A finding whose kind is a known consequence of another finding of the same run
(``CAUSES``) is listed under that one, its *root*, and says so ("probably caused by
..."): a user fixes the first thing they read, and fixing a root clears its
consequences. The pairs are measured, not assumed: ``python -m experiments.precedence``
applies each finding's suggested fix alone to every multi-finding set-up of the
toy and the realistic suite and keeps a pair when the cause's fix cleared the
consequence too (docs/diagnosis.md, "Which finding comes first"); both suites, 5 seeds.

Order: every root in the order the findings were found (by step), each followed by the
findings it probably caused. A consequence is attached to the root of its cause's chain.
"""

CAUSES = {
    "dead_relu": ("unnormalized_inputs", "lr_too_high", "missing_zero_grad", "exploding_gradients:init"),
    "lr_too_high": ("unnormalized_inputs", "missing_zero_grad", "exploding_gradients:init"),
    "lr_too_low": ("saturated_activations",),
    "nan_loss": ("exploding_gradients", "exploding_gradients:init"),
    "edge_of_stability": ("lr_too_high",),
    "exploding_gradients": ("lr_too_high", "missing_zero_grad"),
}
"""``kind -> kinds (``key``) that cause it`` where their fix was measured to clear it (experiments.precedence)."""


def key(finding):
    """A finding's name in ``CAUSES``: its kind, and ``exploding_gradients:init`` for gradients that explode
    from the initialisation (activations growing through the layers at the first records, ``evidence["gain"]``),
    a root where the same kind found later by its growth is a consequence of the learning rate."""
    if finding.kind == "exploding_gradients" and "gain" in (finding.evidence or {}):
        return "exploding_gradients:init"
    return finding.kind


def _causes(finding):
    if finding.kind == "nan_loss" and (finding.evidence or {}).get("module") == "input":
        return ()  # non-finite data is a root, whatever else the run shows
    return CAUSES.get(key(finding), ())


def ordered(findings):
    """``[(finding, root or None)]``: the roots first (by step), each followed by its consequences.

    Args:
        findings: ``Finding``s in the order they were found.
    """
    found = sorted(findings, key=lambda f: f.step)  # stable: the order found within a step
    parent = {}
    for f in found:
        parent[id(f)] = next((c for c in found if c is not f and key(c) in _causes(f)), None)

    def root(f):
        seen = {id(f)}
        while parent[id(f)] is not None and id(parent[id(f)]) not in seen:
            f = parent[id(f)]
            seen.add(id(f))
        return f

    roots = {id(f): root(f) for f in found}
    out = []
    for r in (f for f in found if roots[id(f)] is f):
        out.append((r, None))
        out += [(f, r) for f in found if f is not r and roots[id(f)] is r]
    return out
