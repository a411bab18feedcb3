"""BackPACK glue: which extension serves a curvature quantity (``curvature``), extending models,
keeping BackPACK out of the Cockpit's own passes and advice on its errors (``extend``).

Nothing outside ``cockpit_lite.cockpit`` and ``cockpit_lite.quantities`` imports this
package; ``instruments`` never does.
"""

from cockpit_lite.backend.curvature import (
    CURVATURES, backpack_extended, curvature_extension, curvature_support, unsupported_message, uses_random_numbers,
)
from cockpit_lite.backend.extend import add_advice, backpack_untouched, extend

__all__ = [
    "CURVATURES",
    "add_advice",
    "backpack_extended",
    "backpack_untouched",
    "curvature_extension",
    "curvature_support",
    "extend",
    "unsupported_message",
    "uses_random_numbers",
]
