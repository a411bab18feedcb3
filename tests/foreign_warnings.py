"""``raised_as_errors()``: a UserWarning issued inside cockpit-lite's or the instruments' frames
(by torch, BackPACK or the library itself) becomes an exception.

A default run of the demo, the README's blocks and the docs' examples must print no
warning at its reader (torch's "Full backward hook is firing" used to appear twice a
step). The filter matches the module of the frame a warning is attributed to, which is
the library's frame for a C++ warning raised in a torch call the library makes.
"""

import contextlib
import warnings

LIBRARY = r"(cockpit_lite|instruments)(\.|$)"


@contextlib.contextmanager
def raised_as_errors():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=UserWarning, module=LIBRARY)
        yield
