"""Render worker for ``EpochPlotter(mode="process")``: ``python -m instruments._worker``.

Reads jobs from stdin, each an 8-byte little-endian length followed by a pickled
``{"run": {"record", "params", "name"}, "path", "options"}``, renders the dashboard
to ``path`` and answers on stdout in the same framing with ``{"ok": bool, "error"}``.
A job ``{"ping": True}`` is answered at once (used to wait for start-up). Ends at
end of input. Imports matplotlib and ``cockpit_lite.log`` only. The picture is
written to a temporary file next to ``path`` and renamed (``data.atomic_save``), so
killing the worker never leaves a truncated file; text is drawn literally.
"""

import os
import pickle
import sys


def render(job):
    """Render one job's dashboard to ``job["path"]`` (atomically); returns the path."""
    from instruments.dashboard import Dashboard
    from instruments.data import Run

    dashboard, run = Dashboard(**job.get("options", {})), Run(**job["run"])
    return dashboard.save(run, job["path"])  # atomic, text drawn literally (Dashboard.save)


def main():
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing but replies may reach the protocol stream
    source = sys.stdin.buffer

    import instruments.dashboard  # noqa: F401  (imported before the first job: the ping waits for it)

    while True:
        header = source.read(8)
        if len(header) < 8:
            return
        job = pickle.loads(source.read(int.from_bytes(header, "little")))
        try:
            if not job.get("ping"):
                render(job)
            reply = {"ok": True, "error": None}
        except Exception as error:  # report, keep serving
            reply = {"ok": False, "error": repr(error)}
        payload = pickle.dumps(reply)
        protocol_out.write(len(payload).to_bytes(8, "little") + payload)
        protocol_out.flush()


if __name__ == "__main__":
    main()
