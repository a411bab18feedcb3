"""Write one dashboard PNG per epoch from inside a training loop, without waiting for it.

    from instruments import EpochPlotter

    with EpochPlotter(savedir="runs/pngs", savename="cockpit") as plotter:
        for epoch in range(epochs):
            train_one_epoch(...)                      # cockpit collects as usual
            plotter.plot(cockpit, savename_append=f"__epoch_{epoch:03d}")   # returns at once
    # leaving the block waits until every PNG is written

``plot`` only snapshots the record (``instruments.data.snapshot``: the step dicts
are copied, the values shared; steps already copied by the previous call and more
than two steps old are reused, so the cost grows with the new steps only) and
queues it; rendering happens elsewhere:

- ``mode="process"`` (default): a persistent worker subprocess (``python -m
  instruments._worker``, started on first use; it imports matplotlib and
  ``cockpit_lite.log`` only, never the training script). A feeder thread pickles
  the snapshot (pruned to what the dashboard draws, ``data.drawable``) and sends
  it; the render runs on another core and never holds this process's interpreter
  lock.
- ``mode="thread"``: a background thread in this process. No extra process, but
  rendering is mostly Python and holds the interpreter lock, so the training loop's
  own Python (module calls, BackPACK hooks, the optimiser) waits for it while a
  dashboard renders. Measured on 2 (shared) cores with a cockpit_lite MLP run
  (4 epochs of 50 steps, one dashboard per epoch, interleaved repeats): without
  plotting an epoch took 0.8-1.3 s; next to a rendering thread 3.3-5.4 s; next to
  the render process 1.2-2.9 s (CPU sharing only). ``plot`` itself blocked for
  0.2-0.7 ms in both modes, against 2.6-5.2 s per call in ``sync`` mode.
- ``mode="sync"``: render in the calling thread (for comparison and debugging).

At most ``max_pending`` dashboards wait in the queue; a further ``plot`` blocks
until one is done (so a loop whose epochs are shorter than a render cannot pile up
unbounded memory). ``timings`` holds, per call, the seconds the caller was blocked
and the seconds the render took; ``python -m instruments.benchmark RUN.jsonl``
measures both, and how much a loop running meanwhile slows down.
Errors in the background are re-raised by ``wait``/``close``.

Every picture is written to a temporary file in ``savedir`` and renamed to its final
name (``instruments.data.atomic_save``), so a process killed while rendering never
leaves a truncated PNG behind; text from the record is drawn literally (no mathtext).
"""

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import warnings

from . import data
from .dashboard import Dashboard

_STOP = object()


def _package_path():
    """``PYTHONPATH`` entries under which ``instruments`` and ``cockpit_lite`` import."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [here]
    try:
        import cockpit_lite

        paths.append(os.path.dirname(os.path.dirname(os.path.abspath(cockpit_lite.__file__))))
    except ImportError:  # pragma: no cover
        pass
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join(dict.fromkeys(paths + ([existing] if existing else [])))


class _ProcessRenderer:
    """A worker subprocess speaking length-prefixed pickles over its stdin/stdout."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=_package_path(), MPLBACKEND="Agg")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "instruments._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def ready(self):
        """Block until the worker has imported everything (a ping round trip)."""
        self.render({"ping": True, "path": None})

    def render(self, job):
        payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
        self.proc.stdin.flush()
        header = self.proc.stdout.read(8)
        if len(header) < 8:
            raise RuntimeError(f"instruments render worker exited (code {self.proc.poll()})")
        reply = pickle.loads(self.proc.stdout.read(int.from_bytes(header, "little")))
        if not reply["ok"]:
            raise RuntimeError(f"render worker failed on {job['path']}: {reply['error']}")

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # pragma: no cover
            self.proc.kill()


class EpochPlotter:
    """Render dashboards of a training run in the background, one file per call.

    Args:
        savedir: folder for the PNGs (created).
        savename: file name stem; each call appends its ``savename_append``.
        mode: ``"process"`` (default), ``"thread"`` or ``"sync"`` (see module docs).
        max_pending: dashboards allowed to wait; ``plot`` blocks beyond that.
        fmt: file format (extension), default ``"png"``.
        prune: in process mode, send only what the dashboard draws
            (``instruments.data.drawable``: the last histograms, no ``Parameters``).
            Set it to False when ``dashboard_options`` ask for older histograms.
        **dashboard_options: passed to ``Dashboard`` (``figsize``, ``dpi``,
            ``layerwise``, ``options`` ...).
    """

    def __init__(self, savedir=".", savename="cockpit", mode="process", max_pending=2, fmt="png", prune=True,
                 **dashboard_options):
        if mode not in ("thread", "process", "sync"):
            raise ValueError(f"mode must be 'thread', 'process' or 'sync', not {mode!r}")
        self.savedir = os.fspath(savedir)
        self.savename = savename
        self.mode = mode
        self.fmt = fmt
        self.prune = prune
        self.dashboard_options = dashboard_options
        self.timings = []  # dicts: path, blocked_s, render_s
        self._errors = []
        self._lock = threading.Lock()
        self._queue = queue.Queue(maxsize=max(1, max_pending))
        self._worker = None
        self._renderer = None
        self._count = 0
        self._previous = None  # last snapshot, reused for the settled steps of the same source
        self._previous_source = None

    # ------------------------------------------------------------------ API

    def plot(self, source, savename_append=None, epoch=None):
        """Queue a dashboard of ``source``'s current record; return the path it will be written to.

        Args:
            source: a live cockpit (``get_output()``), a record dict, or a log path.
            savename_append: appended verbatim to ``savename`` (default
                ``"__epoch_{epoch:03d}"``, or a running number when ``epoch`` is None).
            epoch: used for the default ``savename_append``.
        """
        start = time.perf_counter()
        run = self._snapshot(source)
        if savename_append is None:
            savename_append = f"__epoch_{(self._count if epoch is None else epoch):03d}"
        self._count += 1
        path = os.path.join(self.savedir, f"{self.savename}{savename_append}.{self.fmt}")
        timing = {"path": path, "blocked_s": None, "render_s": None}
        with self._lock:
            self.timings.append(timing)
        if self.mode == "sync":
            self._render(run, path, timing)
            self._raise_errors()
        else:
            self._ensure_worker()
            self._queue.put((run, path, timing))
        timing["blocked_s"] = time.perf_counter() - start
        return path

    def wait(self):
        """Block until every queued dashboard is written; re-raise the first background error."""
        if self._worker is not None:
            self._queue.join()
        self._raise_errors()

    def close(self):
        """Wait for the queue, then stop the worker thread (and subprocess)."""
        try:
            self.wait()
        finally:
            if self._worker is not None:
                self._queue.put(_STOP)
                self._worker.join()
                self._worker = None
                atexit.unregister(self._at_exit)
            if self._renderer is not None:
                self._renderer.close()
                self._renderer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ internals

    def _snapshot(self, source):
        if isinstance(source, (str, os.PathLike)):
            return os.fspath(source)  # read in the background
        run = data.load(source)
        previous = self._previous if self._previous_source is source else None
        record = data.snapshot(run.record, previous=previous)
        self._previous, self._previous_source = record, source
        name = run.name if run.path else self.savename  # a live cockpit has no name of its own
        return data.Run(record, run.params, name, dict(run.header), run.path)

    def _ensure_worker(self):
        if self._worker is None:
            self._worker = threading.Thread(target=self._loop, name="instruments-epoch-plotter", daemon=True)
            self._worker.start()
            atexit.register(self._at_exit)  # a script that never calls close() still gets its PNGs

    def _at_exit(self):
        try:
            self.close()
        except Exception as error:  # pragma: no cover - reported, not raised, at interpreter exit
            warnings.warn(f"instruments: EpochPlotter at exit: {error!r}", RuntimeWarning, stacklevel=1)

    def _loop(self):
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                run, path, timing = item
                self._render(run, path, timing)
            finally:
                self._queue.task_done()

    def _render(self, run, path, timing):
        start = time.perf_counter()
        try:
            folder = os.path.dirname(path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            if self.mode == "process":
                if self._renderer is None:
                    self._renderer = _ProcessRenderer()
                if isinstance(run, str):
                    run = data.load(run)
                record = data.drawable(run.record) if self.prune else run.record
                job = {"run": {"record": record, "params": run.params, "name": run.name},
                       "path": path, "options": self.dashboard_options}
                self._renderer.render(job)
            else:
                Dashboard(**self.dashboard_options).save(run, path)  # atomic, text drawn literally
        except Exception as error:  # reported by wait()/close()
            with self._lock:
                self._errors.append(error)
            if self.mode != "sync":
                warnings.warn(f"instruments: rendering {path} failed: {error!r}", RuntimeWarning, stacklevel=1)
        finally:
            timing["render_s"] = time.perf_counter() - start

    def _raise_errors(self):
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def summary(self):
        """Mean/max seconds blocked per call and mean render seconds, over finished calls."""
        with self._lock:
            done = [t for t in self.timings if t["blocked_s"] is not None]
            rendered = [t["render_s"] for t in self.timings if t["render_s"] is not None]
        blocked = [t["blocked_s"] for t in done]
        return {
            "calls": len(done),
            "blocked_mean_s": sum(blocked) / len(blocked) if blocked else float("nan"),
            "blocked_max_s": max(blocked) if blocked else float("nan"),
            "render_mean_s": sum(rendered) / len(rendered) if rendered else float("nan"),
        }
