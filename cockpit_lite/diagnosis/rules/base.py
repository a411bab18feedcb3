"""The rule interface.

A rule is a fold over the record: ``observe(step, entry, history)`` is called once per
step, in step order, with the step's complete entry and the shared ``History``
(already updated with this step), and returns the findings it makes at this step
(usually none). It reads the record only: no torch, no model. The same sequence of
entries gives the same findings, live (``Cockpit``) and offline (``diagnose``).
"""


class Rule:
    """Base class: ``KIND`` (the finding kind), ``SIGNALS`` (the record keys it reads)."""

    KIND = None
    SIGNALS = ()

    def observe(self, step, entry, history):
        raise NotImplementedError
