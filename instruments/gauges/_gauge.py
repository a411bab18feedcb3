"""``Gauge``: a registered gauge (``instruments.gauges.GAUGES``)."""

from dataclasses import dataclass
from typing import Callable

from instruments import data


@dataclass(frozen=True)
class Gauge:
    """A registered gauge: its name, drawing function, default title and the record keys it reads."""

    name: str
    draw: Callable
    title: str
    keys: tuple
    doc: str
    present: Callable = None

    def __call__(self, record, ax, **options):
        return self.draw(record, ax, **options)

    def has_data(self, record):
        """Whether ``record`` holds something this gauge draws (the dashboard leaves it out otherwise)."""
        if self.present is not None:
            return bool(self.present(record))
        return bool(data.tracked(record, *self.keys))
