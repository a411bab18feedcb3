"""``CockpitPlotter``: the original Cockpit's plotting entry point, on the new dashboard.

A Cockpit script ports by changing its import::

    from instruments import CockpitPlotter      # or: from cockpit_lite import CockpitPlotter
    plotter = CockpitPlotter()
    plotter.plot(cockpit, show_plot=False, save_plot=True, savedir="runs", savename_append="epoch_03")
    # -> runs/cockpit__primary__epoch_03.png, as Cockpit names it

Differences from Cockpit's plotter (all deliberate):

- ``source`` may be a live cockpit (any object with ``get_output()``), a record
  dict, or a path to a ``.jsonl`` / ``.json`` log (a path without extension is
  tried with ``.jsonl`` and ``.json``, as Cockpit passed the log path without
  ``.json``; only files count, so a folder of the same name does not get in the way).
- File names are Cockpit's: ``savedir / (savename + "__primary" + ("__" +
  savename_append) + "." + format)``, ``savename`` defaulting to ``"cockpit"`` and
  the format to PNG (``savefig_kwargs["format"]`` overrides it). ``savedir``
  defaults, as in Cockpit, to the log path without its extension for a path source
  (Cockpit used the path it was given as the folder), and to the current directory
  for any other source (Cockpit raised instead). ``plot`` returns the path it saved
  (or ``None``).
- ``secondary_screen=True`` adds the per-layer histogram row to the one figure
  (mean GSNR, CABS and early stopping are always on the main dashboard).
- ``show_plot=True`` needs an interactive matplotlib backend; with a
  non-interactive one (headless, Agg) it warns and only draws (and saves, if asked).
  With ``show_plot=False`` pyplot is never imported, so plotting is thread-safe.
- ``debug=True`` re-raises a failing gauge's exception instead of drawing an
  error message in its panel.
- ``build_animation(logpath)`` renders its frames from the log in hindsight (Cockpit
  assembled PNGs that had to be saved during training under one naming pattern);
  the GIF goes where Cockpit put it, ``logpath`` without extension + ``"__primary.gif"``.
- Files are written to a temporary name in the same folder and renamed
  (``data.atomic_save``): never a half-written picture. Text from the record (finding
  messages, names) is drawn literally, never as mathtext.
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
        savename="cockpit",
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
            save_plot: save the figure to ``savedir/savename__primary__savename_append.png``.
            savedir: folder to save into (default: the log path without extension
                for a path source, else ".").
            savename: file name stem (default ``"cockpit"``).
            savename_append: appended to the name after ``"__"``, e.g. ``"epoch_03"``.
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
        with data.literal_text():
            self.fig = self.dashboard.draw(run, fig=fig)

        if plt is not None:
            plt.show(block=block)
            if not block:
                plt.pause(0.001)
        if save_plot:
            return self._save(run, source, savedir, savename, savename_append, savefig_kwargs)
        return None

    def save_path(self, source, savedir=None, savename="cockpit", savename_append=None, fmt=None):
        """The file ``plot(..., save_plot=True)`` writes for these arguments (see module docs)."""
        if savedir is None:
            if isinstance(source, (str, os.PathLike)):
                savedir = os.path.splitext(data.resolve_path(source))[0]
            else:
                savedir = "."
        append = "" if savename_append is None else f"__{savename_append}"
        return os.path.join(os.fspath(savedir), f"{savename}__primary{append}.{fmt or self.save_format}")

    def _save(self, run, source, savedir, savename, savename_append, savefig_kwargs):
        kwargs = dict(savefig_kwargs or {})
        path = self.save_path(source, savedir, savename, savename_append, kwargs.get("format"))
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        kwargs.setdefault("dpi", self.dpi)
        return data.atomic_save(lambda temporary: self.fig.savefig(temporary, **kwargs), path)

    def build_animation(self, logpath, duration=200, loop=0, steps=None, max_frames=20):
        """Write an animated GIF of the dashboard growing over the run (Cockpit's signature).

        Frame ``k`` is the dashboard of the steps up to ``steps[k]``, drawn from the log
        in hindsight, so nothing has to be saved during training.

        Args:
            logpath: path of the log (``.jsonl`` / ``.json``, or without extension).
            duration: milliseconds per frame.
            loop: how often the GIF repeats (0: forever).
            steps: the last step of each frame; default: the steps where
                ``Cockpit.log`` recorded an epoch, or else up to ``max_frames`` steps
                evenly spread over the run.
            max_frames: the number of frames when ``steps`` is not given and no epoch
                was logged.

        Returns:
            The GIF's path: ``logpath`` without extension + ``"__primary.gif"``.
        """
        import io

        from PIL import Image

        run = data.load(logpath)
        if steps is None:
            steps = sorted(s for s, entry in run.record.items() if "epoch_count" in entry)
            if not steps:
                ordered = sorted(run.record)
                picks = {round(i * (len(ordered) - 1) / max(max_frames - 1, 1)) for i in range(min(max_frames, len(ordered)))}
                steps = [ordered[i] for i in sorted(picks)]
        if not steps:
            raise ValueError(f"{logpath}: the log holds no step to animate")
        frames = []
        for step in steps:
            frame = data.load(run, discard=step)
            with data.literal_text():
                fig = Dashboard(figsize=self.figsize, dpi=self.dpi, layerwise=self._secondary_screen,
                                **self.dashboard_options).draw(frame)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=self.dpi)
            buffer.seek(0)
            frames.append(Image.open(buffer).convert("RGB"))
        path = os.path.splitext(data.resolve_path(logpath))[0] + "__primary.gif"
        return data.atomic_save(lambda temporary: frames[0].save(temporary, format="GIF", append_images=frames[1:],
                                                                 save_all=True, duration=duration, loop=loop), path)
