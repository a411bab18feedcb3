"""Assertions on drawn figures (titles and texts, never pixels)."""


def texts(ax):
    """All text drawn in ``ax`` (also inside offset boxes) and its inset/twin axes, plus its title."""
    from matplotlib.offsetbox import AnchoredOffsetbox, TextArea

    out = [ax.get_title()] + [t.get_text() for t in ax.texts]
    for box in ax.artists:
        if isinstance(box, AnchoredOffsetbox):
            out += [a.get_text().strip() for a in box.findobj(TextArea)]
    for child in getattr(ax, "child_axes", []):
        out += texts(child)
    return out


def all_titles(fig):
    """Titles of every Axes in ``fig`` (including those in subfigures)."""
    return [a.get_title() for a in fig.get_axes()]


def not_tracked(ax):
    return any("not tracked" in t for t in texts(ax))


def drawn_texts(fig):
    """``[(text, bbox in pixels)]`` of every non-empty text the renderer actually draws."""
    from unittest import mock

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig) if fig.canvas is None or not hasattr(fig.canvas, "get_renderer") else fig.canvas
    drawn = []
    original = Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip() and (self.get_alpha() is None or self.get_alpha() > 0):
            drawn.append((self.get_text(), self.get_window_extent(renderer), self))

    with mock.patch.object(Text, "draw", draw):
        canvas.draw()
    return drawn


def overlapping_texts(fig, tolerance=1.0, boxes=None):
    """Pairs of drawn texts whose boxes overlap by more than ``tolerance`` pixels each way.

    ``boxes``: ``drawn_texts(fig)`` if already computed (drawing is the slow part).
    """
    boxes = drawn_texts(fig) if boxes is None else boxes
    out = []
    for i, (a, box_a, _) in enumerate(boxes):
        for b, box_b, _ in boxes[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > tolerance and dy > tolerance:
                out.append((a, b))
    return out


def outside_parent(fig, tolerance=2.0, boxes=None):
    """Drawn texts that reach beyond the (sub)figure they belong to (cut off, or drawn over a neighbour)."""
    out = []
    for text, box, artist in drawn_texts(fig) if boxes is None else boxes:
        parent = artist.get_figure()
        if artist.axes is not None and artist.get_clip_on() and artist in artist.axes.texts:
            continue  # text inside an Axes that is clipped to it
        edge = parent.bbox
        if box.x0 < edge.x0 - tolerance or box.y0 < edge.y0 - tolerance or box.x1 > edge.x1 + tolerance or \
                box.y1 > edge.y1 + tolerance:
            out.append(text)
    return out


def empty_axes(fig):
    """Axes (not colour bars) that show nothing: no line, image, collection, patch, text or offset box."""
    out = []
    for ax in fig.get_axes():
        if ax.get_label() == "<colorbar>":
            continue
        if ax.lines or ax.images or ax.collections or ax.texts or ax.artists or len(ax.patches) > 0:
            continue
        if any(child for child in getattr(ax, "child_axes", [])):
            continue
        out.append(ax.get_title() or ax.get_label())
    return out
