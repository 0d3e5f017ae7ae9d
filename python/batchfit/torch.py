"""PyTorch: one training step that also measures gradient noise on a schedule.

    from batchfit.torch import NoiseProbe
    probe = NoiseProbe(model, optimizer)          # k=8; measuring adds < 5 % to the time
    for x, y in loader:
        loss = probe.step(lambda xb, yb: loss_fn(model(xb), yb), x, y)

`step` does zero_grad, forward, backward and optimizer.step(), times the step
(with torch.cuda.synchronize() on CUDA) and prints the `BATCHFIT` line.

On a measuring step the batch is split into chunks (`batchfit.core.Split`):
`k` micro-batches of `b_small` samples, and the leftover samples when the batch
is not a multiple of `b_small`. Each chunk's mean loss is scaled by its share of
the batch (`n_chunk / B`) and back-propagated, so `.grad` accumulates
`sum_c (n_c / B) g_c`, which for a mean-reduced loss is exactly the gradient of
the batch's mean loss: what one backward pass over the batch gives. The helper
reads `.grad` after each measured micro-batch; the difference from the previous
reading, divided by `b_small / B`, is that micro-batch's gradient `g_i`. So the
optimizer step is the ordinary one; the measurement costs the k + 1 smaller
forward/backward passes instead of one.

What must hold for training to be unchanged:

* `compute_loss(*chunk)` returns the **mean** loss over the samples it is given
  (PyTorch's default `reduction="mean"`).
* Samples do not interact inside the model: BatchNorm computes its statistics
  per micro-batch on a measuring step (different normalisation and running
  statistics); dropout draws the same distribution but different masks. Models
  with BatchNorm train slightly differently on measuring steps.
* No GradScaler/AMP loss scaling inside `step` (use `on_grads` for clipping).
"""
import time

import torch

from . import core


def _split_arg(a, start, stop, n):
    """Cuts every tensor whose first dimension is the batch, inside lists,
    tuples and dicts too; anything else passes unchanged."""
    if torch.is_tensor(a):
        return a[start:stop] if a.dim() > 0 and a.shape[0] == n else a
    if isinstance(a, (list, tuple)):
        return type(a)(_split_arg(v, start, stop, n) for v in a)
    if isinstance(a, dict):
        return {key: _split_arg(v, start, stop, n) for key, v in a.items()}
    return a


def _detached(a):
    """A copy of every tensor (inside lists, tuples and dicts too), so that a
    kept row outlives the caller's buffers."""
    if torch.is_tensor(a):
        return a.detach().clone()
    if isinstance(a, (list, tuple)):
        return type(a)(_detached(v) for v in a)
    if isinstance(a, dict):
        return {key: _detached(v) for key, v in a.items()}
    return a


def _batch_len(args):
    """The first dimension of the first tensor (looking inside lists, tuples, dicts)."""
    for a in args:
        if torch.is_tensor(a) and a.dim() > 0:
            return int(a.shape[0])
        if isinstance(a, (list, tuple, dict)):
            n = _batch_len(list(a.values()) if isinstance(a, dict) else a)
            if n is not None:
                return n
    return None


class NoiseProbe(object):
    """Wraps the step of a PyTorch training loop.

    model: its trainable parameters (`requires_grad`) are the ones measured.
    optimizer: any `torch.optim.Optimizer` (`zero_grad` and `step` are called).
    k, b_small: the split (`batchfit.core.plan_split`; default k = 8,
        b_small = floor(B / 8)).
    every: measure every this many steps; 0: never (the lines then carry only
        step, samples, seconds, loss). Default None: adaptive, spacing the
        measurements by their measured cost so that they add about `budget`
        (default 3.5 %) to the training time (`batchfit.core.Schedule`).
    first: the first measuring step (default `every`; 10 when adaptive).
    budget: the adaptive schedule's share of training time (default 0.035).
    on_grads: called with no arguments after `.grad` holds the batch's gradient
        and before `optimizer.step()` (gradient clipping, for example).
    file: where the lines go (default stdout).
    fixed_rows: the arguments of `compute_loss` (a tuple, as `step` takes the
        batch) holding fixed training rows, say the first 1,024 of the
        training set: their mean loss, evaluated in evaluation mode
        (`model.eval()`, no gradient) after step 1 and then at least 5 % of the
        steps so far apart (`batchfit.core.LossChecks`), goes on the line as
        `train_loss`, the loss batchfit's own trainings judge a target by.
        Default None: the helper keeps the first 1,024 rows it trains on (a
        training at batch B evaluates from step 1024 / B on). Its time is not
        in the step's seconds.
    train_loss: False never evaluates it.
    rows: the rows of the training set the batches are drawn from without
        replacement (a shuffled loader, as `len(dataset)`): the lines carry it
        and batchfit corrects the noise scale for the finite data
        (`batchfit.core.check_rows`). Default None: no correction.
    """

    def __init__(self, model, optimizer, k=None, b_small=None, every=None, first=None,
                 budget=None, on_grads=None, file=None, fixed_rows=None, train_loss=True,
                 rows=None):
        self.model = model
        self.rows = core.check_rows(rows)
        self.optimizer = optimizer
        self.k = k
        self.b_small = b_small
        core.plan_split(64, k=k, b_small=b_small)  # validates k and b_small
        self.schedule = core.Schedule(every, first, budget)
        self.on_grads = on_grads
        self.file = file
        self.steps = 0
        self.last_noise = None
        self.checks = core.LossChecks() if train_loss else None
        # (chunk arguments, rows) of at most EVAL_CHUNK rows each
        self._rows = []
        self._held = 0
        if fixed_rows is not None:
            if not isinstance(fixed_rows, (list, tuple)):
                fixed_rows = (fixed_rows,)
            n = _batch_len(fixed_rows)
            if not n:
                raise ValueError("fixed_rows: no tensor with a batch dimension")
            self._keep(fixed_rows, n, clone=False)
        self._capturing = fixed_rows is None

    def params(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def _sync(self, params):
        dev = params[0].device if params else None
        if dev is not None and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elif dev is not None and dev.type == "mps" and hasattr(torch, "mps"):
            torch.mps.synchronize()

    def step(self, compute_loss, *batch, samples=None):
        """One training step on `batch`; returns the batch's mean loss (a float).

        `compute_loss(*chunk)` gets the arguments of `batch` with every tensor
        whose first dimension is the batch size cut to the chunk (also inside
        lists, tuples and dicts; anything else is passed unchanged) and returns
        the mean loss over it.
        `samples` overrides the batch size read from the first tensor.
        """
        t0 = time.perf_counter()
        self.steps += 1
        n = samples if samples is not None else _batch_len(batch)
        if n is None:
            raise ValueError("no tensor with a batch dimension among the arguments; pass samples=")
        params = self.params()
        split = core.plan_split(n, k=self.k, b_small=self.b_small) \
            if self.schedule.measures(self.steps) else None
        self.optimizer.zero_grad(set_to_none=True)
        for p in params:  # also those the optimizer does not hold: g_i are differences
            p.grad = None
        noise = None
        if split is None:
            loss = compute_loss(*batch)
            loss.backward()
            loss_value = loss.detach()
        else:
            loss_value, noise = self._measure(compute_loss, batch, n, split, params)
            if self.rows is not None:
                noise["rows"] = self.rows
        if self.on_grads is not None:
            self.on_grads()
        self.optimizer.step()
        loss_f = float(loss_value)  # waits for the device
        self._sync(params)
        seconds = time.perf_counter() - t0
        self.last_noise = noise
        self.schedule.record(self.steps, seconds, noise is not None)
        if self._capturing and self._held < core.TARGET_ROWS:
            self._keep(batch, n, clone=True)
        train_loss = None
        # A set the caller gave is complete; a kept one once it holds TARGET_ROWS.
        complete = not self._capturing or self._held >= core.TARGET_ROWS
        if self.checks is not None and complete and self.checks.due(self.steps):
            train_loss = self.fixed_loss(compute_loss)
        core.emit(self.steps, n, seconds, loss=loss_f, noise=noise, file=self.file,
                  train_loss=train_loss)
        return loss_f

    def _keep(self, batch, n, clone):
        """Holds up to TARGET_ROWS rows of `batch` (n rows) for the fixed loss."""
        take = min(n, core.TARGET_ROWS - self._held) if clone else n
        for start in range(0, take, core.EVAL_CHUNK):
            stop = min(start + core.EVAL_CHUNK, take)
            part = tuple(_split_arg(a, start, stop, n) for a in batch)
            if clone:
                part = tuple(_detached(a) for a in part)
            self._rows.append((part, stop - start))
        self._held += take

    def fixed_loss(self, compute_loss):
        """The mean loss over the fixed rows in evaluation mode, without a
        gradient; the model's mode is restored after."""
        was_training = self.model.training
        self.model.eval()
        total, rows = 0.0, 0
        try:
            with torch.no_grad():
                for part, m in self._rows:
                    total += float(compute_loss(*part)) * m
                    rows += m
        finally:
            self.model.train(was_training)
        return total / rows if rows else None

    def _measure(self, compute_loss, batch, n, split, params):
        w = split.b_small / n  # a measured micro-batch's share of the batch
        adam = adam_state(self.optimizer, params)  # v before this step's update
        prev = [None] * len(params)
        # Per parameter, the micro-batches' squared differences summed: Adam's
        # weights fold this step's own g^2 into v, known after the last one.
        sq_sum = [None] * len(params)
        small_sq = None
        small_p = 0.0
        loss_value = 0.0
        chunks = split.chunks()
        for i, ((start, stop), share) in enumerate(zip(chunks, split.weights())):
            part = [_split_arg(a, start, stop, n) for a in batch]
            loss = compute_loss(*part)
            (loss * share).backward()
            loss_value = loss_value + loss.detach() * share
            if i >= split.k:
                continue  # the remainder: trained on, not measured
            sq = None
            for j, p in enumerate(params):
                g = p.grad
                if g is None:
                    continue
                d = g if prev[j] is None else g - prev[j]
                d2 = torch.square(d.detach())
                s = torch.sum(d2, dtype=torch.float64)
                sq = s if sq is None else sq + s
                if adam is not None:
                    sq_sum[j] = d2 if sq_sum[j] is None else sq_sum[j].add_(d2)
                # The last measured chunk's difference is taken: free its copy
                # before Adam's weights need the room.
                prev[j] = g.detach().clone() if i + 1 < split.k else None
            # |g_i|^2 = |d / w|^2
            sq = sq / (w * w) if sq is not None else torch.zeros((), dtype=torch.float64)
            small_sq = sq if small_sq is None else small_sq + sq
            if i + 1 == split.k:
                # .grad now holds w * sum_i g_i; mean_i g_i = that / (k w)
                scale = 1.0 / (split.k * w)
                pre = None
                if adam is not None:
                    # the micro-batches' mean g^2 per coordinate
                    mean_sq = [None if s is None else s.div_(w * w * split.k) for s in sq_sum]
                    pre = adam_weights(adam, mean_sq)
                    small_p = sum(torch.sum(m * q, dtype=torch.float64)
                                  for m, q in zip(mean_sq, pre) if m is not None)
                big = None
                big_p = 0.0
                for j, p in enumerate(params):
                    if p.grad is not None:
                        g2 = torch.square(p.grad.detach())
                        s = torch.sum(g2, dtype=torch.float64)
                        big = s if big is None else big + s
                        if pre is not None and pre[j] is not None:
                            big_p = big_p + torch.sum(g2 * pre[j], dtype=torch.float64)
                big_sq = (big if big is not None else torch.zeros((), dtype=torch.float64)) * scale * scale
                big_p = big_p * scale * scale
        del prev
        noise = {
            "b_small": split.b_small,
            "g_small_sq": float(small_sq) / split.k,
            "b_big": split.b_big,
            "g_big_sq": float(big_sq),
        }
        if pre is not None:
            noise["preconditioned"] = {
                "g_small_sq": float(small_p),
                "g_big_sq": float(big_p),
            }
        return loss_value, noise


def adam_state(optimizer, params):
    """Per parameter, (v, beta2, eps, step) of an Adam-family optimizer (Adam,
    AdamW, NAdam, RAdam: anything with `betas` and `eps` in its group keeping
    `exp_avg_sq` and `step` in its state once it has stepped): v the second
    moment before this step's update (None before the first), `step` the
    updates so far. None for any other optimizer or a measured parameter it
    does not hold (the line then carries the raw norms only)."""
    groups = {}
    for group in getattr(optimizer, "param_groups", []):
        for p in group["params"]:
            groups[id(p)] = group
    out = []
    for p in params:
        group = groups.get(id(p))
        if group is None or "betas" not in group:
            return None
        state = getattr(optimizer, "state", {}).get(p, {})
        key = "max_exp_avg_sq" if group.get("amsgrad") else "exp_avg_sq"
        v, step = state.get(key), state.get("step")
        if (v is None) != (step is None):
            return None
        out.append((None if v is None else v.detach(), float(group["betas"][1]),
                    float(group.get("eps", 1e-8)), 0.0 if step is None else float(step)))
    return out


def adam_weights(state, mean_sq):
    """Per parameter, the weights 1 / (sqrt(v_hat) + eps)^2 of the step Adam
    takes: its update is m_hat / (sqrt(v_hat) + eps), v_hat the bias-corrected
    second moment with this step's g^2 folded in (Adam folds before it
    divides), here the micro-batches' mean g^2 `mean_sq`. Without the step's
    term a coordinate no earlier step moved has v = 0 and a weight of 1/eps^2,
    and one micro-batch touching it reads as a noise scale of 1e10; with the
    big batch's g^2 a coordinate whose micro-batches cancel does the same.
    The same rule as batchfit's own engine (crates/engine/src/noise.rs)."""
    out = []
    for (v, beta2, eps, step), g2 in zip(state, mean_sq):
        if g2 is None:
            out.append(None)
            continue
        folded = (1.0 - beta2) * g2 if v is None else beta2 * v + (1.0 - beta2) * g2
        correction = 1.0 - beta2 ** (step + 1.0)
        out.append(1.0 / torch.square(torch.sqrt(folded / correction) + eps))
    return out
