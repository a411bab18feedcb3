"""``CockpitPlotter``: the original Cockpit's plotting entry point, on the new dashboard.

A Cockpit script ports by changing its import::

    from instruments import CockpitPlotter
    plotter = CockpitPlotter()
    plotter.plot(cockpit, show_plot=False, save_plot=True, savedir="runs", savename_append="__epoch_03")

Differences from Cockpit's plotter (all deliberate):

- ``source`` may be a live cockpit (any object with ``get_output()``), a record
  dict, or a path to a ``.jsonl`` / ``.json`` log (a path without extension is
  tried with ``.jsonl`` and ``.json``, as Cockpit passed the log path without
  ``.json``).
- File name: ``savedir / (savename + savename_append + "." + format)``.
  ``savename_append`` is appended verbatim (Cockpit inserted ``"__"`` and a
  ``"__primary"`` screen tag). Defaults: ``savedir`` is the log's folder for a path
  source and the current directory otherwise (Cockpit raised instead);
  ``savename`` is the log's file name without extension for a path source and
  ``"cockpit"`` otherwise; the format is PNG (``savefig_kwargs["format"]``
  overrides it). ``plot`` returns the path it saved (or ``None``).
- ``secondary_screen=True`` adds the per-layer histogram row to the one figure
  (mean GSNR, CABS and early stopping are always on the main dashboard).
- ``show_plot=True`` needs an interactive matplotlib backend; with a
  non-interactive one (headless, Agg) it warns and only draws (and saves, if asked).
  With ``show_plot=False`` pyplot is never imported, so plotting is thread-safe.
- ``debug=True`` re-raises a failing gauge's exception instead of drawing an
  error message in its panel.
"""

import os
import warnings

from . import data
from .dashboard import Dashboard

_NON_INTERACTIVE = {"agg", "pdf", "ps", "svg", "pgf", "cairo", "template"}


def _interactive_pyplot():
    """pyplot, if its backend can show windows (or notebook output), else ``None``."""
    import matplotlib.pyplot as plt

    backend = str(plt.get_backend()).lower()
    if backend in _NON_INTERACTIVE:
        return None
    return plt


class CockpitPlotter:
    """Plot the cockpit dashboard of a run; compatible with ``cockpit.CockpitPlotter``.

    Args:
        secondary_screen: add the per-layer histogram row.
        figsize: figure size in inches (default 16 x 10).
        dpi: resolution of saved files (default 100).
        **dashboard_options: passed to ``Dashboard`` (e.g. ``options=``).
    """

    save_format = "png"

    def __init__(self, secondary_screen=False, figsize=(16, 10), dpi=100, **dashboard_options):
        self._secondary_screen = secondary_screen
        self.figsize = figsize
        self.dpi = dpi
        self.dashboard_options = dashboard_options
        self.fig = None
        self.dashboard = None

    def plot(
        self,
        source,
        show_plot=True,
        block=False,
        save_plot=False,
        savedir=None,
        savename=None,
        savename_append=None,
        savefig_kwargs=None,
        show_log_iter=False,
        discard=None,
        plot_title=None,
        debug=False,
    ):
        """Draw the dashboard for ``source``; show and/or save it.

        Args:
            source: live cockpit, record dict, or path to a ``.jsonl``/``.json`` log.
            show_plot: show the figure (interactive backends only).
            block: with ``show_plot``, block until the window is closed.
            save_plot: save the figure to ``savedir/savename+savename_append.png``.
            savedir: folder to save into (default: the log's folder, else ".").
            savename: file name without extension (default: the log's name, else "cockpit").
            savename_append: appended verbatim to ``savename``, e.g. ``"__epoch_03"``.
            savefig_kwargs: passed to ``Figure.savefig`` (``format``, ``dpi``, ...).
            show_log_iter: symlog step axes.
            discard: drop the steps after this one.
            plot_title: figure title (default "cockpit-lite · <run name>").
            debug: re-raise gauge errors.

        Returns:
            The saved file's path, or ``None`` if nothing was saved.
        """
        run = data.load(source, discard=discard)
        self.dashboard = Dashboard(
            figsize=self.figsize,
            dpi=self.dpi,
            layerwise=self._secondary_screen,
            log_steps=show_log_iter,
            title=plot_title,
            strict=debug,
            **self.dashboard_options,
        )
        plt = None
        fig = None
        if show_plot:
            plt = _interactive_pyplot()
            if plt is None:
                warnings.warn(
                    "instruments: show_plot=True but matplotlib's backend is non-interactive "
                    "(headless?); the figure is only drawn. Use save_plot=True to get a file.",
                    stacklevel=2,
                )
            else:
                width, height = self.figsize
                fig = plt.figure(num="cockpit-lite", figsize=(width, height + (3.2 if self._secondary_screen else 0)),
                                 clear=True, layout="constrained")
        self.fig = self.dashboard.draw(run, fig=fig)

        if plt is not None:
            plt.show(block=block)
            if not block:
                plt.pause(0.001)
        if save_plot:
            return self._save(run, source, savedir, savename, savename_append, savefig_kwargs)
        return None

    def save_path(self, source, savedir=None, savename=None, savename_append=None, fmt=None):
        """The file ``plot(..., save_plot=True)`` writes for these arguments (see module docs)."""
        is_path = isinstance(source, (str, os.PathLike))
        if savedir is None:
            savedir = os.path.dirname(os.path.abspath(data.resolve_path(source))) if is_path else "."
        if savename is None:
            if is_path:
                savename = os.path.splitext(os.path.basename(data.resolve_path(source)))[0]
            else:
                savename = "cockpit"
        return os.path.join(savedir, f"{savename}{savename_append or ''}.{fmt or self.save_format}")

    def _save(self, run, source, savedir, savename, savename_append, savefig_kwargs):
        kwargs = dict(savefig_kwargs or {})
        path = self.save_path(source, savedir, savename, savename_append, kwargs.get("format"))
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        kwargs.setdefault("dpi", self.dpi)
        self.fig.savefig(path, **kwargs)
        return path
