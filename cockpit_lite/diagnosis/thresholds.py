"""Every threshold of the diagnosis rules, documented once.

Thresholds are relative wherever the quantity allows it: a layer against the other
layers, a run against its own first steps, the loss against its value at
initialisation (``L₀``, the median of the first 3 finite mini-batch losses; ≈ ln C for
a C-class classifier at a sane initialisation). "Sustained" means on that many
consecutive records, so that one noisy mini-batch cannot raise a finding.

| rule | signal | threshold | why |
|---|---|---|---|
| lr_too_high | Loss, UpdateSize, ParamNorm | median of the last ``COLLAPSE_WINDOW`` (7) finite losses > ``SPIKE`` · L_s (2; L_s the lower of L₀ and the first loss), after updates ≥ ``DIVERGE_RATIO`` (0.05) of the weights' norm (the largest 3-step median so far), unless a logged held-out loss is below its first value | a healthy run never gets far above its starting loss; a divergent step size doubles it within a few steps ; a Huber regression with 3 % outlier targets has 3-medians up to 3.8 L₀ (its L₀ a lucky low batch), 7-medians up to 2.3 L₀ (1 of 5 seeds) at updates ≤ 0.015, while a loop without zero_grad diverges after updates of 0.13 – 0.19; healthy realistic runs' largest 3-step median update 0.003 – 0.029 |
| lr_too_high | Loss, UpdateSize, ParamNorm | one loss > ``SPIKE_ONE`` (10) × the first loss, right after an update ≥ ``OVERSHOOT_RATIO`` (0.2) of the weights' norm (the largest of the 3 updates before it) | a single mini-batch 10x worse than at initialisation after a large step is a blown-up step (Adam at 0.3 on the CNN: 30x after 3.5; ViT at Adam 1.0: 0.7 – 8.6); after small updates it is not the step size: a Huber regression with 3 % outlier targets spiked 12x after 0.015 (its first batch a lucky one), identity-initialised RNNs 1e3 – 1e5x after 0.075 – 0.09 (their gradients 1e5x their start: ``exploding_gradients``), a loss scale blowing up after 0.002 |
| lr_too_high | Loss, valid/test loss | learned ≥ ``LEARNED`` (30 %) of L₀, then the median of the last ``COLLAPSE_WINDOW`` (7) records climbs back ``COLLAPSE`` (60 %) of the way to L₀, sustained ``SUSTAIN``; with a logged held-out loss, it must have climbed back the same way | "learns and then collapses" (dead units, a blown-up step); a 7-median ignores up to 3 outlier batches (a regression with outlier targets swings 0.06 – 1.4 by batch while its held-out loss falls); mini-batch noise on digits moves it by < 20 % of the gained loss |
| lr_too_high | UpdateSize, ParamNorm | median ‖Δθ‖/‖θ‖ of the last 3 steps ≥ ``HIGH_RATIO`` (0.5) while the 3-median loss stays ≥ 0.9 L_s (the lower of L₀ and the first loss: such updates raise the second and third losses already) | measured: healthy SGD/Adam runs ≤ 0.11 per step (shallow sigmoid net at SGD 0.5); Adam at 0.3 gives 3.5 |
| lr_too_high | UpdateSize, ParamNorm, Loss | a 3-step median ‖Δθ‖/‖θ‖ (the largest so far) ≥ ``OVERSHOOT_RATIO`` (0.2) and the 3-median loss is ≥ ``OVERSHOOT_LOSS`` (1.05) · L_s | the healthy realistic runs (36): largest 3-step median update 0.003 – 0.029, largest 3-median loss in the first 20 records 1.0 – 1.07 L₀ (the Huber regression 3.8, at updates ≤ 0.013); healthy toy runs ≤ 0.11 with a falling loss; a char GPT with AdamW at 0.1 without warm-up: updates 0.27, loss 1.09 – 1.4 L₀ (3 seeds). The loss condition alone would be noise: it only counts together with updates ≥ 7× the healthy maximum |
| lr_too_high | UpdateSize, ParamNorm | the suggested divisor of the learning rate: the updates' size (the finding's, else the largest 3-step median) / ``HEALTHY_STEP`` (0.03), at least 3 | the largest 3-step median update of the healthy realistic runs is 0.003 – 0.029; a fixed 10x left Adam at 0.3 on the CNN (updates 3.5) killing its ReLUs and a ViT at Adam 1.0 (8.6) diverging |
| lr_too_high | NonfiniteOrigin | non-finite loss with non-finite parameters | an update made the weights Inf/NaN: divergence, not a bug in one op |
| lr_too_low | Loss, UpdateSize, ParamNorm, learning rate | after ``MIN_STEPS`` (10), the lr not rising: loss moved < ``LOW_DROP`` (10 %) of L₀ either way (a worse loss is not a small step) **and** median ‖Δθ‖/‖θ‖ < ``LOW_RATIO`` (3e-4), every layer getting a gradient | healthy SGD/Adam runs move weights by 1e-3 – 1e-2 of their norm per step (Karpathy's 1e-3 rule); both conditions together separate a too small step from a hard problem; mini-batch noise alone moves a 5-record median loss by up to ±8 % of L₀ in the first records (a ViT and a ResNet-BN at lr ≤ 1e-4), so 2 % missed them; a warm-up is small on purpose |
| lr_too_low | learning rate (GradPresence / cp.log), UpdateSize | late: the lr fell to ≤ 1/``LATE_COLLAPSE`` (30) of its peak at record S and ‖Δθ‖/‖θ‖ since is ≤ 1/``LATE_COLLAPSE`` of its largest 3-record median before, reached by a drop ≥ ``LATE_COLLAPSE``× in one step, or by step decays (≥ ``LATE_STEP`` (5)× between records) closer together than ``CLOSE_STEPS`` (0.5) × the step of the first, or smoothly (5 records of decrease) and then ``STALL_SHARE`` (0.25) × S steps at tiny updates | no healthy schedule divides the lr by 30 in one step (one decay is 10×); per-epoch milestones stepped every batch come 10 steps apart after 30 (a healthy staircase: 40 apart after 40); a healthy cosine, linear or OneCycle schedule is below 1/30 of its peak only in its last ~12 % of steps, the end of training (≤ 0.14 S); ExponentialLR(0.9) stepped per batch is below it from step 33 of 150 |
| exploding_gradients | GradNorm, ParamNorm | per weight tensor r = ‖g‖/‖θ‖: min r of the first two / max r of the last two ≥ ``EXPLODE_RATIO`` (50), sustained; or total ‖g‖ ≥ ``EXPLODE_GROWTH`` (100) × its early level (median of the first 3 records) on one record, at any point of the run | measured on the healthy suite: first/last within 0.1 – 8.1 (transformer), 33 BatchNorm blocks without residuals ~180 (Yang et al. 2019), ‖g‖ never above 10× its start; an LSTM without clipping: 2.6e4× by step 3, then NaN (one record is all there is); identity-initialised ReLU RNNs 440 – 3e4× at the step they explode, some back to normal at the next record (Adam; a second record at 100× missed 2 of 5 of them); in a homogeneous (ReLU, no normalisation) net every layer's r scales alike, so growth towards the input shows in saturating or normalised deep nets |
| exploding_gradients | ActivationStats (mean, std) | at each of the first ``SUSTAIN`` records, the RMS of the unbounded activation modules' outputs grows ≥ ``ACT_GAIN`` (3) × per module on average (last / first, k-th root) | a layer's forward gain is its backward gain; healthy nets at initialisation 0.34 – 1.6 per module (default init shrinks, Kaiming keeps ~1, BatchNorm/residual blocks ~1.1 – 1.35); ReLU nets initialised with torch.randn (std 1): 7.8 – 8.6 (fan-in 64 – 128, √(fan_in/2) ≈ 5.7 – 8); other libraries' activation classes (``cockpit_lite.utils.activations``), 5 seeds each at their own init: Hugging Face BERT, GPT-2, Llama 0.979 – 1.025, timm ViT, EfficientNet, LeViT, EfficientViT, GhostNet 0.976 – 1.013, ConvNeXt 1.10 – 1.11, MLP-Mixer 1.15 – 1.16 |
| exploding/vanishing_gradients | ParamNorm (shapes) | a weight tensor whose ‖θ‖/√numel is < ``TINY_WEIGHT`` (1 %) of the median over the weight tensors is left out of the relative comparison | a zero-initialised ViT class token had ‖g‖/‖θ‖ = 830 at ‖θ‖ = 4e-4 while the total ‖g‖ was flat; trained weights sit within 10× of each other's per-entry size |
| vanishing_gradients | GradNorm, ParamNorm | r(first) / min r(last two weight tensors; of two, the last) ≤ ``VANISH_RATIO`` (1e-3), sustained | measured: healthy nets ≥ 0.03; 8 sigmoid layers give ~1e-5 (each layer multiplies by ≤ 0.25); the smaller of the two, as ``exploding_gradients`` takes the larger: timm's MLP-Mixer (AdamW, warm-up; 3 configurations, 11 runs before, 15 after) has its head zero-initialised, r = 11 – 41 once past ``TINY_WEIGHT`` while the layer before it had 1e-4 – 7e-4, as had the first: the larger read 6e-5 – 4e-4 at every seed |
| dead_relu | ActivationStats.dead | ≥ ``DEAD`` (50 %) of a ReLU module's units never fire in a batch, sustained (``dead`` is NaN below ``DEAD_MIN_SAMPLES`` = 8 samples: a healthy ReLU layer of 64 units at batch 1 is 42–61 % "dead", tests/diagnosis/test_dead_relu_finding.py) | SageMaker Debugger's DeadRelu threshold; healthy nets measured < 25 % (digits' always-zero border pixels included) |
| saturated_activations | ActivationStats.saturated | ≥ ``SATURATED`` (50 %) of tanh/sigmoid outputs (of an LSTM/GRU's gate values) in the flat tails (derivative < 2 % of its peak), sustained | healthy tanh/sigmoid layers measured < 10 % early in training; the gates of a healthy LSTM language model (Adam, clipping; 3 seeds) 0 % at step 0, ≤ 18.3 % by step 150; weights 20x too large: 61-64 % from step 0; the squeeze-excitation gates of timm's EfficientNet-B0 (its own ``Sigmoid`` class), MobileNetV3 and GhostNet (``Hardsigmoid``), AdamW, 5 seeds, the first 12 steps: ≤ 1.2 %, 2.3 %, 0 % |
| unnormalized_inputs | InputStats | max(\\|mean\\|, std) of the first input ≥ ``INPUT_SCALE`` (10), 2 records | standardised or [0, 1] inputs have scale ≤ 1, a 0..255 image ~100: an order of magnitude on each side  `info` only when the first layer the input reaches is a BatchNorm/LayerNorm/GroupNorm/InstanceNorm (``ActivationStats`` meta `input_layer`): it removes the scale (digits 0..255 into BatchNorm: 90 %+ accuracy) |
| missing_zero_grad | GradPresence.first_backward | the first backward pass after an optimizer step finds non-zero gradients in the parameters, 2 records (old logs: gradients present in `cp(step)` with an update since the previous context) | a zeroed gradient is exactly 0 or `None`: no threshold; accumulation done right (`zero_grad` once per optimizer step, `cp` around any micro-batch) starts each window from 0 |
| shuffled_labels | valid/test accuracy (``cp.log``), Loss, UpdateSize, GradNorm/ParamNorm | held-out accuracy ≤ ``CHANCE_FACTOR`` (2) / C (at most half way from 1/C to 1), C = round(exp L₀), at ``SUSTAIN`` (3) logs after ``MIN_STEPS``, while the gradient reaches the first weight tensor (its relative gradient > ``VANISH_RATIO`` of the output end's: eight sigmoid layers at chance were called shuffled labels), the step size is not too small, the loss not diverging and the training loss not learning either (3-median ≥ ``CHANCE_LOSS`` (0.95) L₀) | labels independent of the inputs leave nothing to generalise; the shuffled-label twins' held-out accuracy 1 – 17 % (10 classes, 400 logs), a learning model's far above 20 % within 30 steps; with shuffled labels the training loss stays at 0.98 – 1.02 L₀ over the first logs (10 runs), while a ResNet-BN whose running statistics lag a OneCycle schedule was at chance held out at 0.51 – 0.90 L₀, and healthy accumulation ×4 (loss / 4 logged: C = round(exp(L₀ / 4)) = 2) falls below 0.95 L₀ as it learns; a deep ReLU net with PyTorch's default init (activations shrink 5× over 4 ReLU modules; ≤ 1/``ACT_GAIN`` left out) sits at chance with a flat loss for 20 – 45 steps before it learns |
| nan_loss | Loss / flags, NonfiniteOrigin | the first non-finite loss | none needed |
| noise_dominates | GradVariance (tr Σ), GradNorm, batch size (or NormTest²) | over a window of 5 records, B_simple / B = mean tr Σ / (B (mean ‖g‖² − mean tr Σ / B)) ≥ ``NOISE_RATIO`` (10) (‖g‖² of a batch overestimates ‖G‖² by tr Σ / B: subtracted) | measured: healthy digits MLP at B = 64 ≤ 3.8; B = 2 on noisy regression reaches 10 – ∞  McCandlish et al. 2018: below the noise scale B_simple, a step makes less progress than the same samples would in one batch; 10× means the batch is an order of magnitude too small ; above ``NOISE_QUOTE`` (1000) × B (or ∞) no batch size or lr factor is quoted (the estimate is then all noise); `info` while the loss (median of the last 3 or of the window's records) still falls below 0.9 L₀ |
| edge_of_stability | HessMaxEV, GradPresence (lr, momentum) | η λ_max ≥ 2 (1 + β) (SGD, momentum β), 2 records | Cohen et al. 2021: gradient descent on a quadratic of curvature λ diverges for η > 2/λ; heavy-ball momentum moves the limit to 2(1+β)/λ ; ``info`` while the 3-median loss is below ``LEARNING`` (0.9) L₀: gradient descent trains at the edge of stability as a rule (Cohen et al. 2021), and no rate below 2/λ_max clears it for long (λ_max rose back past 2/η within 8 – 14 steps at 0.45 of the limit, full-batch digits MLP) |
| overfitting | train/valid loss (``cp.log``) | levels = medians of the last ``OVERFIT_WINDOW`` (3) logs: held-out level ≥ (1 + ``OVERFIT_RISE``) (1.1) × its lowest level and ≥ ``OVERFIT_Z`` (2) σ above it (σ: the log-to-log noise of the held-out loss, MAD of the last ``OVERFIT_NOISE`` (10) differences), the training level fell ≥ ``OVERFIT_FALL`` (20 %) since, and the held-out level ≥ ``OVERFIT_GAP`` (3) × the training level | a rising trend beyond the noise of the evaluations, and memorisation (the training data fit much better than held-out data); healthy runs whose held-out loss rose for a while (warm restarts, BatchNorm statistics lagging, overconfident phases of Adam and deep ReLU nets; 5 seeds each) stayed within 2σ or within 3× of their training loss; single-log comparisons against the lowest log called 7 of them overfitting |

Calibration (what each threshold was measured against, healthy spread → threshold):

- Suites: the toy suite (``experiments/broken_networks.py``: 12 healthy twins, MLP/CNN/transformer,
  deep ReLU nets, on digits and synthetic data, 26 planted bugs) and the realistic suite
  (``experiments/realistic_diagnosis.py``: 21 healthy recipes — char GPTs with AdamW, warm-up +
  cosine or linear decay, clipping, dropout; LSTM LMs (Adam; SGD with clipping and step decays);
  ViTs with a zero class token (fp32, bf16); ResNet-BN with SGD + weight decay (OneCycle, cosine);
  bf16 autocast; accumulation ×4; batch 4 SGD; label smoothing + dropout; Huber regression with
  outlier targets; a head on a frozen body; raw pixels into a first BatchNorm; held-out numbers in
  cp.log's test slots; warm restarts; a classic staircase of step decays; deep ReLU nets; a CNN
  whose held-out loss wobbles — and 32 faulty twins), every one on 5 seeds:
  ``python -m experiments.seed_stability record`` / ``judge`` (the found/clean table and the
  margins of every threshold, docs/diagnosis.md); ``python -m experiments.realistic_diagnosis``
  prints the spread below for every healthy run.
- ``SPIKE`` (2): 7-record median loss / L₀ over the 36 healthy realistic runs 0.95 – 1.02, except
  the Huber regression with outliers 1.35 – 2.73 (its mini-batch loss is dominated by the outlier
  batches; its held-out loss falls, which vetoes the rule).
- ``EXPLODE_GROWTH`` (100): total ‖g‖ / early level 1.02 – 3.6 on the
  healthy realistic runs (label smoothing + dropout highest), ≤ 10 on the toy twins; the faulty
  twins reach 105 (a ReLU RNN, then NaN) to 1e10.
- ``EXPLODE_RATIO`` (50): min r(first two) / max r(last two) 0.009 (GPT) – 16.5 (ViT with its class
  token, after ``TINY_WEIGHT`` leaves the zero-initialised token out while it is tiny); 33
  BatchNorm blocks without residuals ~150 – 350.
- ``LOW_RATIO`` (3e-4): 5-record median ‖Δθ‖/‖θ‖ 3.1e-4 (the GPT at the end of its cosine
  schedule) – 0.025 on the healthy realistic runs; it fires only together with a loss that moved
  < ``LOW_DROP`` of L₀, which no healthy run has after 10 records. ``LATE_COLLAPSE`` (30): the
  per-batch MultiStepLR twin drops the update 47 – 60×; one StepLR decay is 10×.
- ``CHANCE_FACTOR`` (2): held-out accuracy of the shuffled-label twins up to 17 % at the first logs
  (10 classes); a bound of 1.6 / C (16 %) missed 2 of 10 seeds on one noisy log.
- ``INPUT_SCALE`` (10), ``DEAD``, ``SATURATED``, ``NOISE_RATIO``, ``EOS``, ``OVERFIT_*``: as in the
  table (toy suite); not re-measured on the realistic suite, where no healthy run raised them.
"""

SUSTAIN = 3
MIN_STEPS = 10
SPIKE = 2.0
SPIKE_ONE = 10.0
LEARNED = 0.3
COLLAPSE = 0.6
COLLAPSE_WINDOW = 7
LOW_DROP = 0.1
LOW_RATIO = 3e-4
LATE_STEP = 5.0
LATE_COLLAPSE = 30.0
CLOSE_STEPS = 0.5
STALL_SHARE = 0.25
EXPLODE_RATIO = 50.0
EXPLODE_GROWTH = 100.0
ACT_GAIN = 3.0
TINY_WEIGHT = 0.01
HIGH_RATIO = 0.5
OVERSHOOT_RATIO = 0.2
OVERSHOOT_LOSS = 1.05
HEALTHY_STEP = 0.03
DIVERGE_RATIO = 0.05
VANISH_RATIO = 1e-3
DEAD = 0.5
SATURATED = 0.5
INPUT_SCALE = 10.0
CHANCE_FACTOR = 2.0
CHANCE_LOSS = 0.95
NOISE_RATIO = 10.0
NOISE_WINDOW = 5
NOISE_QUOTE = 1000.0
OVERFIT_WINDOW = 3
OVERFIT_RISE = 0.1
OVERFIT_Z = 2.0
OVERFIT_NOISE = 10
OVERFIT_FALL = 0.2
OVERFIT_GAP = 3.0
EOS = 2.0
EOS_RECORDS = 2
LEARNING = 0.9
