"""Writing a JSON-lines log: one line per step part, appended at once, run segments, a full disk
survived (``JSONLinesWriter``; the format: ``cockpit_lite.log.record``)."""

import collections
import errno
import json
import os
import time
import warnings

from cockpit_lite.log.record import FORMAT, FORMAT_VERSION, to_jsonable


def new_run_id():
    """A fresh run id: UTC time of day and 6 random hex digits, e.g. ``"20250301T101500-3fa2c1"``."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def _check_appendable(path):
    """Whether ``path`` can take a new segment; returns True if it lacks a final newline (torn)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(path, "rb") as file:
        first = file.readline(4096)
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
    signature, start = b'{"format": "' + FORMAT.encode() + b'"', first.strip()
    torn_header = not first.endswith(b"\n") and signature.startswith(start)  # a run that died writing it
    if not (start.startswith(signature) or torn_header):
        raise ValueError(
            f"{path} exists and is not a {FORMAT} log (its first line is no {FORMAT} header); refusing to "
            "write into it. Fix: pass another log path, or move that file away."
        )
    return last != b"\n"


class JSONLinesWriter:
    """Append one JSON line per step part to ``path``, written at once; never truncates.

    Args:
        path: file to write; its folder is created if needed. An existing log is kept:
            the writer appends a new run segment (see the module docstring). A file
            that is not a cockpit-lite log is refused (``ValueError``).
        header: dict merged into ``{"format", "version", "run", "started"}``.
        strict: raise ``OSError`` when a write fails. By default a failing write
            (a full disk) warns once, keeps the line in memory and is retried, in
            order, at the next ``append`` and at ``close``; nothing raises.
        run: the run id of the segment to continue (a resumed run; default: a new
            id, ``new_run_id()``). Readers treat consecutive segments with the same id
            as one.

    The header line is written together with the first step's line (or at ``close``),
    so that ``resume`` can still name the run it continues.

    Attributes:
        run: the run id written in the header.
        pending: number of lines (or line parts) not yet on disk.
        errors: the ``OSError`` of every failed write, in order.
    """

    def __init__(self, path, header, strict=False, run=None):
        self.path = os.fspath(path)
        self.strict = strict
        self.run = run if run is not None else new_run_id()
        self.errors = []
        self.closed = False
        self._queue, self._done, self._failing = collections.deque(), 0, False
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        torn = _check_appendable(self.path)
        self._file = open(self.path, "ab", buffering=0)  # unbuffered: a write is on disk or not at all
        self._torn = torn  # a crashed run left half a line: end it, so that the new header stands on its own line
        first = {"format": FORMAT, "version": FORMAT_VERSION, "run": self.run,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if run is not None:
            first["resumed"] = True
        self._header = {**first, **{k: v for k, v in header.items() if k not in first}}  # written with the first line

    def resume(self, run, after):
        """Continue the segment of run ``run`` instead of starting one (a resumed run).

        ``after``: the last step the saved run had entered when its state was saved; readers
        drop what that segment holds at later steps (the saved run may have gone on past its
        checkpoint; the resumed run records those steps again).

        Raises:
            ValueError: once a step's line was written (the header is written with it).
        """
        if self._header is None:
            raise ValueError(f"the log {self.path} has its header already: resume a run before its first step")
        self.run = run
        self._header.update(run=run, resumed=True, resumed_after=after)

    @property
    def pending(self):
        return len(self._queue)

    def append(self, step, entries):
        """Append the ``entries`` of ``step`` as one line (and any line a failed write left)."""
        if self.closed:
            raise ValueError(f"the log {self.path} is closed; a closed Cockpit records no more steps")
        self._put({"step": int(step), **to_jsonable(entries)})

    def _put(self, obj):
        self._queue.append(self._take_header() + (json.dumps(obj) + "\n").encode("utf-8"))
        self._flush()

    def _take_header(self):
        """The header line (after a newline ending a torn line) if not written yet, else ``b""``."""
        if self._header is None:
            return b""
        header, self._header = self._header, None
        return (b"\n" if self._torn else b"") + (json.dumps(header) + "\n").encode("utf-8")

    def _flush(self):
        """Write the queue in order; returns whether it is empty. Partial writes continue where they stopped."""
        while self._queue:
            chunk = self._queue[0]
            try:
                written = self._file.write(memoryview(chunk)[self._done:])
                if not written:
                    raise OSError(errno.EIO, "the file took no bytes")
            except OSError as error:
                self._fail(error)
                return False
            self._done += written
            if self._done >= len(chunk):
                self._queue.popleft()
                self._done = 0
        self._failing = False
        return True

    def _fail(self, error):
        self.errors.append(error)
        if self.strict:
            raise OSError(error.errno, f"cannot write the log {self.path}: {error.strerror or error} "
                                       "(strict=True; the line is kept and written at the next step)") from error
        if not self._failing:
            warnings.warn(
                f"cockpit-lite: cannot write the log {self.path} ({error}); training goes on and the record "
                "stays complete in memory (get_output()). The unwritten lines are retried, in order, at every "
                "step and at close(); what close() cannot write stays in memory only (save it with "
                "cp.write(path) elsewhere). Fix: free space on that disk (strict=True raises instead).",
                RuntimeWarning, stacklevel=4,
            )
        self._failing = True

    def close(self):
        """Write what is pending, ``fsync`` and close the file. Later appends raise ``ValueError``.

        A failing write or ``fsync`` warns (once per failure streak) unless ``strict``.
        """
        if self.closed:
            return
        try:
            if self._header is not None:  # no step was recorded: the segment is its header
                self._queue.append(self._take_header())
            if self._flush():
                try:
                    os.fsync(self._file.fileno())
                except OSError as error:
                    if error.errno not in (errno.EINVAL, errno.ENOTSUP):  # a pipe or a special file
                        self._fail(error)
        finally:
            self.closed = True
            try:
                self._file.close()
            except OSError as error:  # a network file system may report a failed write-back here
                self.errors.append(error)
