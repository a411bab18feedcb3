"""Moments of data split into parts (ranks' shares of a batch, samples): pooled without cancelling."""


def pooled(counts, sums, within):
    """``(mean, Σ(x − mean)²)`` of the union of parts, from each part's ``counts`` (entries), ``sums`` (``Σx``)
    and ``within`` (``Σ(x − x̄_part)²``), 1-d tensors: ``Σ within + Σ counts · (x̄_part − mean)²`` (Chan,
    Golub and LeVeque 1979). Each part's squared deviations from its own mean keep the spread that
    ``Σx² − n·mean²`` cancels when ``|mean| ≫ std``. A part of no entries adds nothing."""
    mean = sums.sum() / counts.sum()
    spread = (counts * (sums / counts.clamp(min=1) - mean).square()).sum()
    return mean, within.sum() + spread
