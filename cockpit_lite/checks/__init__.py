"""Pre-flight checks: catch training bugs in seconds, before the first epoch.

    from cockpit_lite import checks
    report = checks.run(model, loss_fn, (x, y), task="classification", num_classes=10,
                        data={"x_train": ..., "y_train": ..., "x_test": ..., "y_test": ...})
    print(report)              # one line per check, the fix under each failure
    report.failed              # e.g. ["init_loss", "data_normalization"]
    report.raise_if_failed()   # one AssertionError listing every failure (also under python -O)

Every check returns a ``CheckResult(name, passed, value, threshold, message, fix)``;
``passed`` is None when the check does not apply (skipped, with the reason), never
True, and when the data given cannot decide it (``inconclusive``, with what to pass in
``fix``), never False. ``run`` works on deep copies: the user's parameters, buffers (BatchNorm
running statistics), gradients, optimizer and the global random state are the
same afterwards, bit for bit. Karpathy's "A Recipe for Training Neural Networks"
(2019) is the source of most checks.

Thresholds (each module's docstring gives the reason):

==============================  ======================================  ==============================================
check                           passes when                              why this threshold
==============================  ======================================  ==============================================
init_loss                       loss / ln C <= 1.5                      healthy inits give 1.0-1.3; one-sided
init_calibration                mean H(p) / ln C >= 0.75                healthy inits give 0.8-1 (logit std 1)
batch_independence_forward      relative leak <= 1e-5                   exact independence gives 0 (float rounding);
batch_independence_backward     relative leak <= 1e-5                   mixing over B samples leaks ~1/B
causal_forward                  relative leak <= 1e-5                   as above, probed at t0 = 1, T/2, T-1
causal_backward                 relative leak <= 1e-5                   as above
nonzero_gradients               no parameter without a gradient         None, all-zero or non-finite, or frozen
overfit_one_batch               loss <= 5% of ln C (regr.: of L0)       p(right class) ~ 0.89; 16 samples, <= 300 steps
input_independent_baseline      loss(real) <= 0.9 loss(zeros)           a model ignoring its input gives exactly 1;
                                held-out gain >= 0.1 x headroom         inconclusive with too few held-out samples
gradient_check                  error <= 1e-4 (float64, eps 1e-6)       rounding and truncation ~1e-10; bugs O(1)
data_duplicates                 0 test rows in train (4 decimals/std)   any leak inflates the test score
data_imbalance                  max / min class count <= 10, or the     beyond 10:1 accuracy hides the rare classes;
                                test split as imbalanced (z < 3)        a skewed split (not the data) is the bug
data_normalization              |mean| <= 1, 0.2 <= std <= 5, and       [0, 1] images pass, 0..255 and 0..16 fail;
                                feature std spread <= 100x              test split scaled like the training split
data_nonfinite                  no NaN / Inf                            one NaN poisons the step that draws it
==============================  ======================================  ==============================================

Layers that mix samples by design (BatchNorm) are in eval mode for the
batch-independence and causal checks, and the result says so; for integer token
inputs the backward checks differentiate at the output of the input embedding,
found by a forward hook. Conventions: batch axis 0, class axis 1 (last for
``causal_lm``), sequence axis ``sequence_dim`` (1 for ``causal_lm``).

The same lesson's tools: ``lr_range_test`` (Smith 2017), ``suggest_clip_value``
and ``reinit_dead_relus``.
"""

from cockpit_lite.checks.clipping import ClipSuggestion, suggest_clip_value
from cockpit_lite.checks.dead_relu import reinit_dead_relus
from cockpit_lite.checks.lr_range import LRRangeResult, lr_range_test
from cockpit_lite.checks.report import CheckResult, Report
from cockpit_lite.checks.runner import CHECKS, assert_all, run

__all__ = ["CHECKS", "CheckResult", "ClipSuggestion", "LRRangeResult", "Report", "assert_all", "lr_range_test",
           "reinit_dead_relus", "run", "suggest_clip_value"]
