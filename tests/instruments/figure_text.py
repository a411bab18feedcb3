"""Assertions on drawn figures (titles and texts, never pixels)."""


def texts(ax):
    """All text drawn in ``ax`` and its inset/twin axes, plus its title."""
    out = [ax.get_title()] + [t.get_text() for t in ax.texts]
    for child in getattr(ax, "child_axes", []):
        out += texts(child)
    return out


def all_titles(fig):
    """Titles of every Axes in ``fig`` (including those in subfigures)."""
    return [a.get_title() for a in fig.get_axes()]


def not_tracked(ax):
    return any("not tracked" in t for t in texts(ax))
