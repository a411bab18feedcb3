"""``TensorBoardSink``: the record as TensorBoard scalars and histograms.

    from cockpit_lite.integrations.tensorboard import TensorBoardSink
    cp = Cockpit(model, configuration("economy"), sinks=[TensorBoardSink("runs/tb")])

Through ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package:
``pip install ".[tensorboard]" in a clone of cockpit-lite``). Tags (``prefix`` first, default
``"cockpit"``):

- every scalar quantity and epoch value: ``cockpit/NormTest``, ``cockpit/train_loss``;
- per-parameter lists: ``cockpit/GradNorm/<parameter name>``; per-layer values:
  ``cockpit/NormTest/layers/<parameter name>``;
- 1-d histograms as TensorBoard histograms (``add_histogram_raw``, the counts as they
  are, bucket limits = the right bin edges); a 2-d histogram as its two marginals,
  ``cockpit/GradHist2d/grad`` and ``cockpit/GradHist2d/param``; per-layer
  histograms under ``.../layers/<parameter name>``.
"""

import numpy as np

from cockpit_lite.integrations import require
from cockpit_lite.integrations.sinks import Sink, histograms, scalars


class TensorBoardSink(Sink):
    """Write what a Cockpit records to a TensorBoard event file.

    Args:
        log_dir: folder of the event file (``SummaryWriter(log_dir)``); ignored when
            ``writer`` is given.
        writer: an existing ``SummaryWriter`` to write to (then ``close`` only flushes it;
            e.g. Lightning's ``trainer.logger.experiment``).
        prefix: first part of every tag.
        layers: also write the per-parameter and per-layer values.
    """

    def __init__(self, log_dir=None, writer=None, prefix="cockpit", layers=True):
        if writer is None:
            require("tensorboard", "tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            writer, self._owned = SummaryWriter(log_dir=log_dir), True
        else:
            self._owned = False
        self.writer = writer
        self.prefix = prefix
        self.layers = layers

    def _tag(self, tag):
        return f"{self.prefix}/{tag}" if self.prefix else tag

    def write(self, step, entries, names):
        for tag, value in scalars(entries, names):
            if self.layers or "/" not in tag:
                self.writer.add_scalar(self._tag(tag), value, global_step=step)
        for tag, value in histograms(entries, names):
            if not self.layers and "/layers/" in tag:
                continue
            edges = value["edges"]
            counts = np.asarray(value["hist"], dtype=float)
            if isinstance(edges, (list, tuple)):  # 2-d: the marginals of both axes
                for axis, suffix in enumerate(("grad", "param")):
                    self._histogram(f"{tag}/{suffix}", counts.sum(axis=1 - axis), edges[axis], step)
            else:
                self._histogram(tag, counts, edges, step)

    def _histogram(self, tag, counts, edges, step):
        edges = np.asarray(edges, dtype=float)
        total = counts.sum()
        if total <= 0:
            return
        centres = (edges[1:] + edges[:-1]) / 2
        self.writer.add_histogram_raw(
            self._tag(tag), min=float(edges[0]), max=float(edges[-1]), num=float(total),
            sum=float((centres * counts).sum()), sum_squares=float((centres**2 * counts).sum()),
            bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=step,
        )

    def close(self):
        self.writer.flush()
        if self._owned:
            self.writer.close()
