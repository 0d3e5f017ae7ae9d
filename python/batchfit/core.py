"""Framework-free parts of the helper: the split of a batch into micro-batches,
the schedule of measuring steps, the noise fields and the `BATCHFIT` line.

Nothing here imports numpy, torch or tensorflow. Gradients may be numpy arrays,
or anything with `.ravel()` / iteration; squared norms are plain floats.

The protocol (docs/run.md, "Gradient noise of your own training"): on a
measuring step the batch's first `B_big = k * b_small` samples are split into
`k` micro-batches of `b_small`; `g_i` is the gradient of the mean loss over
micro-batch `i`; the line carries

    "noise": {"b_small": b_small, "g_small_sq": mean_i |g_i|^2,
              "b_big": B_big,     "g_big_sq":   |mean_i g_i|^2}

from which batchfit estimates |G|^2 and tr(Sigma) (McCandlish et al. 2018,
appendix A). The statistics are batchfit's (Rust); this package only measures.
"""
import json
import math
import os
import sys
from collections import namedtuple

PREFIX = "BATCHFIT "

#: Micro-batches per measurement when neither `k` nor `b_small` is given.
DEFAULT_K = 8

#: Default share of training time the measurements may take: with `every`
#: unset the helper spaces its measuring steps by their measured cost so that
#: they add at most about this much. 3.5 % leaves room for the helper's own
#: per-step cost (about 1 % at 5 ms steps) and for timing noise, so that the
#: total stays under 5 % (bench/noise_overhead.py measures it; bench/README.md). A
#: measuring step costs c ordinary steps, from c ~ 2 (big batches, where the k
#: micro-batches use the hardware as well as the batch did) to c ~ k + 2 (small
#: batches, where every pass costs its fixed overheads), so no fixed rate fits
#: every model and batch: 1 in 20 costs 5 % at c = 2 and 40 % at c = 9.
DEFAULT_BUDGET = 0.035

#: The first measuring step when `every` is unset (the steps before it time the
#: ordinary step).
DEFAULT_FIRST = 10

#: Set by `batchfit run` for its noise trial (to 1: measure every step); it
#: replaces the adaptive default, never an `every` the caller gave.
NOISE_EVERY_ENV = "BATCHFIT_NOISE_EVERY"

#: Training rows whose loss the helper evaluates (`train_loss` on the line):
#: the fixed subset batchfit's own trainings judge a target by (the engine's
#: `TARGET_ROWS`), so `batchfit run` reads the loss `advise` reads.
TARGET_ROWS = 1024

#: Rows per forward pass when evaluating that loss.
EVAL_CHUNK = 512

#: Evaluations of that loss are at least this share of the steps so far apart
#: (the spacing of the engine's sweep): every step up to step 20, then about
#: 46 more per tenfold of steps, so a 200-step trial evaluates about 66 times
#: and a 4,000-step one about 126; linear interpolation between them keeps
#: the steps to a target within a few percent on a smooth loss curve.
CHECK_SPACING = 0.05

class Split(namedtuple("Split", "b_small k b_big remainder")):
    """How one batch is split on a measuring step.

    `k` micro-batches of `b_small` samples (`b_big = k * b_small`) are measured;
    the last `remainder` samples of the batch (`batch - b_big`: `batch mod k`
    when the helper chose `b_small`) are one more chunk that is trained on but
    not measured, so the optimizer still sees the whole batch.
    """

    __slots__ = ()

    def chunks(self):
        """(start, stop) of each chunk in the batch: the `k` measured
        micro-batches, then the remainder if there is one."""
        out = [(i * self.b_small, (i + 1) * self.b_small) for i in range(self.k)]
        if self.remainder:
            out.append((self.b_big, self.b_big + self.remainder))
        return out

    def weights(self):
        """Each chunk's share of the batch (`size / batch`): the weight of its
        mean loss in the batch's mean loss. Sums to 1."""
        batch = self.b_big + self.remainder
        return [(stop - start) / batch for start, stop in self.chunks()]


def plan_split(batch, k=None, b_small=None):
    """The split of a batch of `batch` samples, or None when it cannot be measured.

    * neither given: `k = 8`, `b_small = floor(batch / k)`;
    * `k` given: `b_small = floor(batch / k)`;
    * `b_small` given: as many micro-batches of it as fit, at most `k` when `k`
      is given too.

    `b_small` is at least 1: a batch smaller than `k` is split into `batch`
    micro-batches of one sample. Measuring needs at least two micro-batches,
    so a batch of fewer than 2 samples (or fewer than `2 * b_small`) is never
    measured.
    """
    batch = int(batch)
    if k is not None and int(k) < 2:
        raise ValueError("k must be at least 2, got %r" % (k,))
    if b_small is not None and int(b_small) < 1:
        raise ValueError("b_small must be at least 1, got %r" % (b_small,))
    if batch < 2:
        return None
    if b_small is None:
        kk = DEFAULT_K if k is None else int(k)
        bs = max(1, batch // kk)
        kk = min(kk, batch // bs)
    else:
        bs = int(b_small)
        kk = batch // bs if k is None else min(int(k), batch // bs)
    if kk < 2:
        return None
    return Split(bs, kk, bs * kk, batch - bs * kk)


def split_batch(batch, k=None, b_small=None):
    """(start, stop) of each chunk of a batch of `batch` samples: the measured
    micro-batches then the remainder. A batch that cannot be measured is one chunk."""
    s = plan_split(batch, k=k, b_small=b_small)
    return [(0, int(batch))] if s is None else s.chunks()


class Schedule(object):
    """Which steps measure; steps are numbered from 1.

    Fixed (`every` given): step `s` measures when `s >= first` and
    `(s - first) % every == 0`; `first` defaults to `every`; `every = 0` never
    measures.

    Adaptive (`every` None, the default): a budget. The first measurement is at
    step `first` (default 10). Each measuring step costs `c` ordinary steps (its
    time over the median time of the recent ordinary steps), so it spends
    `c - 1` steps' worth of extra time; step `s` measures when the extra spent
    so far plus that of one more measurement (the median `c` of the last five)
    is at most `budget * s` (default 3.5 %). So after the first measurement the
    measurements never add more than `budget` to the time so far, and in a long
    run they add about that much. The caller reports each step's time with
    `record`.

    With `every` unset and `BATCHFIT_NOISE_EVERY=N` in the environment
    (`batchfit run`'s noise trial), the schedule is fixed: every N steps from
    step 1 (`first` still moves the first).
    """

    def __init__(self, every=None, first=None, budget=None):
        if every is None and os.environ.get(NOISE_EVERY_ENV):
            text = os.environ[NOISE_EVERY_ENV]
            try:
                every = int(text)
            except ValueError:
                raise ValueError("%s must be an integer, got %r" % (NOISE_EVERY_ENV, text))
            if first is None and every > 0:
                first = 1
        self.budget = DEFAULT_BUDGET if budget is None else float(budget)
        if not self.budget > 0:
            raise ValueError("budget must be > 0, got %r" % (budget,))
        self.adaptive = every is None
        self.every = 0 if every is None else int(every)
        if self.every < 0:
            raise ValueError("every must be >= 0, got %r" % (every,))
        if self.adaptive:
            self.first = DEFAULT_FIRST if first is None else int(first)
        else:
            self.first = self.every if first is None else int(first)
        if (self.adaptive or self.every) and self.first < 1:
            raise ValueError("first must be >= 1, got %r" % (first,))
        self._ordinary = []  # recent ordinary step times
        self._costs = []  # recent c
        self._spent = 0.0  # extra time of the measurements so far, in ordinary steps
        self._last = 0  # the last measuring step

    def measures(self, step):
        if not self.adaptive:
            if self.every == 0 or step < self.first:
                return False
            return (step - self.first) % self.every == 0
        if step < self.first:
            return False
        c = self.cost()
        if c is None:  # nothing timed yet: every `first` steps
            return step >= self._last + self.first
        return self.budget * step + 1e-9 >= self._spent + max(c - 1.0, 0.0)

    def record(self, step, seconds, measured):
        """Tells the schedule how long step `step` took and whether it measured."""
        if not self.adaptive:
            return
        if not measured:
            if step > 2:  # batchfit's warm-up steps are not typical
                self._ordinary = (self._ordinary + [float(seconds)])[-64:]
            return
        self._last = step
        if self._ordinary:
            base = sorted(self._ordinary)[len(self._ordinary) // 2]
            if base > 0:
                c = float(seconds) / base
                self._costs = (self._costs + [c])[-5:]
                self._spent += max(c - 1.0, 0.0)

    def cost(self):
        """The current estimate of c (a measuring step in ordinary steps), or None."""
        if not self._costs:
            return None
        return sorted(self._costs)[len(self._costs) // 2]


class LossChecks(object):
    """When to evaluate the loss on the fixed training rows: after step 1,
    then whenever the step is at least `spacing` (default 5 %) of the last
    evaluation's step past it (at least one step)."""

    def __init__(self, spacing=CHECK_SPACING):
        self.spacing = float(spacing)
        if not self.spacing >= 0:
            raise ValueError("spacing must be >= 0, got %r" % (spacing,))
        self._next = 1

    def due(self, step):
        """Whether to evaluate after step `step` (and, if so, schedules the next)."""
        if step < self._next:
            return False
        self._next = step + max(1, int(math.ceil(self.spacing * step)))
        return True


def sq_norm(g):
    """Squared Euclidean norm of a gradient (a numpy array, a sequence of
    arrays, or a sequence of floats), as a Python float accumulated in float64."""
    if isinstance(g, (list, tuple)) and g and not _is_number(g[0]):
        return sum(sq_norm(part) for part in g)
    if hasattr(g, "ravel") and hasattr(g, "dot"):
        flat = g.ravel()
        if hasattr(flat, "astype"):
            flat = flat.astype("float64")
        return float(flat.dot(flat))
    return float(sum(float(x) * float(x) for x in g))


def _is_number(x):
    return isinstance(x, (int, float)) or (hasattr(x, "shape") and getattr(x, "shape", None) == ())


def noise_fields(micro_grad_sq_norms, big_grad_sq_norm, b_small, b_big):
    """The `noise` object of a line.

    `micro_grad_sq_norms`: |g_i|^2 for each of the k micro-batches (each g_i the
    gradient of the mean loss over its b_small samples); `big_grad_sq_norm`:
    |mean_i g_i|^2, the squared norm of the gradient over the B_big samples.
    Returns None when a value is not finite (the line then has no `noise`).
    """
    sq = [float(x) for x in micro_grad_sq_norms]
    b_small, b_big = int(b_small), int(b_big)
    if not sq:
        raise ValueError("no micro-batch gradients")
    if b_small < 1 or b_big != b_small * len(sq):
        raise ValueError("b_big (%d) must be k (%d) x b_small (%d)" % (b_big, len(sq), b_small))
    small = sum(sq) / len(sq)
    big = float(big_grad_sq_norm)
    if not (math.isfinite(small) and math.isfinite(big)):
        return None
    return {"b_small": b_small, "g_small_sq": small, "b_big": b_big, "g_big_sq": big}


def check_rows(rows):
    """`rows` as the helpers take it: None, or the rows of the training set a
    shuffled loader draws each epoch's batches from without replacement.
    batchfit then corrects |G|^2 for the finite data (a mean of n of N rows
    strays from the full data's gradient less than n independent draws do), as
    `advise` corrects its own runs; on a few thousand rows late in training the
    uncorrected |G|^2 reads low, B_noise high."""
    if rows is None:
        return None
    if isinstance(rows, bool) or int(rows) != rows or rows < 1:
        raise ValueError("rows must be a positive whole number of training rows, not %r" % (rows,))
    return int(rows)


def noise_from_grads(micro_grads, b_small):
    """`noise_fields` from the k micro-batch gradients themselves (numpy arrays
    of one shape, or lists of per-parameter arrays)."""
    grads = list(micro_grads)
    k = len(grads)
    if grads and isinstance(grads[0], (list, tuple)):
        mean = [sum(parts) / k for parts in zip(*grads)]
    else:
        mean = sum(grads) / k
    return noise_fields([sq_norm(g) for g in grads], sq_norm(mean), b_small, b_small * k)


def line(step, samples, seconds, loss=None, noise=None, train_loss=None):
    """One protocol line (no newline):
    `BATCHFIT {"step": .., "samples": .., "seconds": .., "loss": .., "train_loss": ..,
    "noise": {..}}`. The noise object may carry `rows`, the rows of the data
    set the batch was drawn from without replacement (`check_rows`); a count
    below `b_big` is no such data set and is left out. `loss` is the step's own mean loss; `train_loss` the mean
    loss on the fixed training rows after the step, in evaluation mode (on the
    steps that evaluate it). Each is left out when None or not finite (JSON has
    no NaN), as is a noise object with a value that is not."""
    rec = {"step": int(step), "samples": int(samples), "seconds": float(seconds)}
    for key, value in (("loss", loss), ("train_loss", train_loss)):
        if value is not None:
            value = float(value)
            if math.isfinite(value):
                rec[key] = value
    if noise is not None:
        n = {
            "b_small": int(noise["b_small"]),
            "g_small_sq": float(noise["g_small_sq"]),
            "b_big": int(noise["b_big"]),
            "g_big_sq": float(noise["g_big_sq"]),
        }
        rows = noise.get("rows")
        if rows is not None and int(rows) >= n["b_big"]:
            n["rows"] = int(rows)
        pre = noise.get("preconditioned")
        if pre is not None:
            p = {"g_small_sq": float(pre["g_small_sq"]), "g_big_sq": float(pre["g_big_sq"])}
            if all(math.isfinite(x) and x >= 0 for x in p.values()):
                n["preconditioned"] = p
        if math.isfinite(n["g_small_sq"]) and math.isfinite(n["g_big_sq"]):
            rec["noise"] = n
    return PREFIX + json.dumps(rec)


def emit(step, samples, seconds, loss=None, noise=None, file=None, train_loss=None):
    """Prints `line(...)` and flushes (batchfit reads the lines as they come); returns it."""
    text = line(step, samples, seconds, loss=loss, noise=noise, train_loss=train_loss)
    out = sys.stdout if file is None else file
    out.write(text + "\n")
    out.flush()
    return text
