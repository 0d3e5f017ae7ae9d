"""Keras 3 (TensorFlow backend): gradient-noise measurements inside `fit`.

    from batchfit.keras import NoiseModel, BatchfitLines
    model = NoiseModel(model)                      # k=8 micro-batches
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, callbacks=[BatchfitLines()])

`fit` hides the gradient, so the measurement lives in the training step:
`NoiseModel` wraps your model (its `call` is your model's) and overrides
`train_step`. On an ordinary step it does what Keras's own TensorFlow
`train_step` does (one `tf.GradientTape`, one gradient, `apply_gradients`). On a
measuring step it splits the batch into `k` micro-batches of `b_small`
(`batchfit.core.plan_split`, computed in the graph from the batch's size) and a
remainder chunk when the batch is not a multiple of `b_small`, takes one
`tf.GradientTape` gradient per chunk, and applies
`sum_c (n_c / B) g_c` -- for a mean-reduced loss, the batch's gradient -- so the
update is the ordinary one. The squared norms go into variables that the
`BatchfitLines` callback reads after the step; it also times the step (Keras has
finished the step when the callback reads them) and prints the `BATCHFIT` line.
The callback decides which steps measure (`batchfit.core.Schedule`: adaptive
by default, about 3.5 % of the training time; `every=N` for a fixed rate) by
setting a flag variable before each step; without the callback the model
never measures and trains as usual.

Limits (tested with Keras 3.15 / TensorFlow 2.21 on CPU):

* TensorFlow backend only (JAX and PyTorch backends: not supported); one
  device, no `tf.distribute` strategy; `steps_per_execution` must be 1 (the
  callback sees one step per call); no mixed-precision loss scaling.
* Uses Keras's `compute_loss` (losses with `sum_over_batch_size`, the default,
  i.e. a mean) and its private `_loss_tracker` so that the `loss` in the logs is
  the usual running mean.
* Layers that mix samples (BatchNormalization) see micro-batches on measuring
  steps, so those steps train slightly differently; dropout draws different
  masks of the same distribution.
* Models with one output or a list of outputs (not a dict of outputs).
* `fixed_rows=(x, y)` on `BatchfitLines` adds `train_loss`, the loss on those
  rows in inference mode, every few steps.
* The loss on the line is the step's own mean loss (Keras's `loss` log is the
  running mean over the epoch).
"""
import sys
import time

import keras
import tensorflow as tf

from . import core


def _dense(g, v):
    if g is None:
        return tf.zeros(v.shape, v.dtype)
    return tf.convert_to_tensor(g)


def _sq(grads, weights=None):
    """sum |g|^2 over the parameters, each coordinate weighted by `weights`
    (one tensor per parameter) when given."""
    if weights is None:
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in grads])
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64)) * w)
                     for g, w in zip(grads, weights)])


def _adam_state(optimizer, variables):
    """(velocities, beta2, eps) of an Adam-family Keras optimizer (`_velocities`
    with `beta_2`: Adam, AdamW, Nadam; with `rho`: RMSprop), v read before this
    step's update; None for other optimizers."""
    velocities = getattr(optimizer, "_velocities", None)
    eps = getattr(optimizer, "epsilon", None)
    beta2 = getattr(optimizer, "beta_2", getattr(optimizer, "rho", None))
    if not velocities or eps is None or beta2 is None or not hasattr(optimizer, "_get_variable_index"):
        return None
    try:
        vs = [velocities[optimizer._get_variable_index(v)] for v in variables]
    except (KeyError, IndexError, ValueError):
        return None
    return vs, float(beta2), float(eps)


def _adam_weights(state, mean_sq):
    """Per variable 1 / (sqrt(v) + eps)^2, v the second moment with this step's
    g^2 (the micro-batches' mean, `mean_sq`) folded in, as the optimizer folds
    it before it divides; the step it takes is m / (sqrt(v) + eps) up to one
    factor common to every coordinate, which the noise scale's ratio does not
    see. Without the step's term a coordinate no earlier step moved has v = 0
    and a weight of 1/eps^2 (a noise scale of 1e10 where one micro-batch
    touches it). The same rule as batchfit's own engine and the PyTorch helper."""
    vs, beta2, eps = state
    return [1.0 / tf.square(tf.sqrt(beta2 * tf.cast(v, tf.float64) + (1.0 - beta2) * g2) + eps)
            for v, g2 in zip(vs, mean_sq)]


def _cut(data, start, stop):
    return tf.nest.map_structure(lambda t: None if t is None else t[start:stop], data)


class _State(object):
    """Variables shared by the model's graph and the callback (kept out of
    Keras's weight tracking)."""

    def __init__(self):
        self.measure = tf.Variable(False, trainable=False, name="batchfit_measure")
        # measured, samples, b_small, g_small_sq, b_big, g_big_sq, loss,
        # preconditioned (1/0), g_small_sq and g_big_sq in Adam's geometry
        self.stats = tf.Variable(tf.zeros([10], tf.float64), trainable=False, name="batchfit_stats")


class NoiseModel(keras.Model):
    """Wraps `model` (any Keras model) so that `fit` can measure gradient noise.

    k, b_small: the split (as `batchfit.core.plan_split`; default k = 8,
    b_small = floor(B / 8)). Compile and fit the wrapper; save `model.inner`.
    """

    def __init__(self, inner, k=None, b_small=None, **kwargs):
        super().__init__(**kwargs)
        core.plan_split(64, k=k, b_small=b_small)  # validates
        self.inner = inner
        self.k = k
        self.b_small = b_small
        self._bf = _State()

    def call(self, inputs, training=None):
        return self.inner(inputs, training=training)

    # -- the step -----------------------------------------------------------

    def _loss_grads(self, x, y, sw, weights):
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
        grads = tape.gradient(loss, weights)
        return loss, y_pred, [_dense(g, v) for g, v in zip(grads, weights)]

    def _plan(self, n):
        """(b_small, k) of `core.plan_split` in the graph."""
        if self.b_small is None:
            kk = tf.constant(core.DEFAULT_K if self.k is None else int(self.k))
            bs = tf.maximum(1, n // kk)
            return bs, tf.minimum(kk, n // bs)
        bs = tf.constant(int(self.b_small))
        kk = n // bs if self.k is None else tf.minimum(int(self.k), n // bs)
        return bs, kk

    def train_step(self, data):
        x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
        weights = self.trainable_weights
        n = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        bs, kk = self._plan(n)
        measure = tf.logical_and(self._bf.measure, tf.logical_and(n >= 2, kk >= 2))

        def ordinary():
            loss, y_pred, grads = self._loss_grads(x, y, sw, weights)
            zero = tf.constant(0.0, tf.float64)
            stats = tf.stack([zero, tf.cast(n, tf.float64), zero, zero, zero, zero,
                              tf.cast(loss, tf.float64), zero, zero, zero])
            return loss, tf.nest.flatten(y_pred), grads, stats

        def measured():
            return self._measured(x, y, sw, weights, n, bs, kk)

        loss, flat_pred, grads, stats = tf.cond(measure, measured, ordinary)
        y_pred = flat_pred[0] if len(flat_pred) == 1 else list(flat_pred)
        self._bf.stats.assign(stats)
        if hasattr(self, "_loss_tracker") and self._loss_tracker is not None:
            self._loss_tracker.update_state(loss, sample_weight=n)
        self.optimizer.apply_gradients(zip(grads, weights))
        return self.compute_metrics(x, y, y_pred, sample_weight=sw)

    def _measured(self, x, y, sw, weights, n, bs, kk):
        cut = lambda a, b: (_cut(x, a, b), _cut(y, a, b), _cut(sw, a, b))  # noqa: E731
        adam = _adam_state(self.optimizer, weights)
        # Micro-batch 0 outside the loop: it fixes the structure of the outputs.
        loss0, pred0, g0 = self._loss_grads(*cut(0, bs), weights)
        flat0 = tf.nest.flatten(pred0)
        arrays = [tf.TensorArray(p.dtype, size=kk, infer_shape=False).write(0, p) for p in flat0]
        # Per variable, the micro-batches' g^2 summed (Adam's weights fold their
        # mean into v, known after the last one).
        sq0 = [tf.square(tf.cast(g, tf.float64)) for g in g0]
        init = (tf.constant(1), [tf.identity(g) for g in g0], _sq(g0), sq0,
                tf.cast(loss0, tf.float64), arrays)

        def body(i, acc, small, acc_sq, loss_sum, arrs):
            loss_i, pred_i, g_i = self._loss_grads(*cut(i * bs, (i + 1) * bs), weights)
            arrs = [a.write(i, p) for a, p in zip(arrs, tf.nest.flatten(pred_i))]
            acc = [a + g for a, g in zip(acc, g_i)]
            acc_sq = [a + tf.square(tf.cast(g, tf.float64)) for a, g in zip(acc_sq, g_i)]
            return (i + 1, acc, small + _sq(g_i), acc_sq,
                    loss_sum + tf.cast(loss_i, tf.float64), arrs)

        _, acc, small, acc_sq, loss_sum, arrays = tf.while_loop(
            lambda i, *_: i < kk, body, init)
        kf = tf.cast(kk, tf.float64)
        big_sq = _sq(acc) / (kf * kf)  # |mean_i g_i|^2
        if adam is None:
            has_pre, small_p, big_p = tf.constant(False), tf.constant(0.0, tf.float64), \
                tf.constant(0.0, tf.float64)
        else:
            mean_sq = [a / kf for a in acc_sq]
            pre = _adam_weights(adam, mean_sq)
            has_pre = tf.constant(True)
            small_p = tf.add_n([tf.reduce_sum(m * w) for m, w in zip(mean_sq, pre)])
            big_p = _sq(acc, pre) / (kf * kf)
        b_big = bs * kk
        r = n - b_big

        def remainder():
            loss_r, pred_r, g_r = self._loss_grads(*cut(b_big, n), weights)
            return tf.cast(loss_r, tf.float64), tf.nest.flatten(pred_r), g_r

        def none():
            return (tf.constant(0.0, tf.float64), [p[:0] for p in flat0],
                    [tf.zeros_like(g) for g in acc])

        loss_r, flat_r, g_r = tf.cond(r > 0, remainder, none)
        nf, bsf, rf = tf.cast(n, tf.float64), tf.cast(bs, tf.float64), tf.cast(r, tf.float64)
        # The batch's gradient: sum over chunks of (n_c / B) g_c.
        grads = [tf.cast(bsf / nf, a.dtype) * a + tf.cast(rf / nf, a.dtype) * g
                 for a, g in zip(acc, g_r)]
        loss = (bsf * loss_sum + rf * loss_r) / nf
        flat_pred = [tf.concat([a.concat(), p], axis=0) for a, p in zip(arrays, flat_r)]
        stats = tf.stack([tf.constant(1.0, tf.float64), nf, bsf, small / kf,
                          tf.cast(b_big, tf.float64), big_sq, loss,
                          tf.cast(has_pre, tf.float64), small_p, big_p])
        return tf.cast(loss, loss0.dtype), flat_pred, grads, stats


class BatchfitLines(keras.callbacks.Callback):
    """Times each training step and prints its `BATCHFIT` line, with the step's
    loss and, on measuring steps, the noise fields (with a `NoiseModel`).

    every, first, budget: the schedule (`batchfit.core.Schedule`; default
    adaptive, about 3.5 % of the training time; `every=0` never measures).
    file: where the lines go (default stdout). With a model that is not a
    `NoiseModel` the lines carry step, samples (`batch_size`) and seconds only.
    fixed_rows: `(x, y)` of fixed training rows, say 1,024 of the training
    set: their mean loss (`model.compute_loss` on `model(x, training=False)`,
    dropout off) after step 1 and then at least 5 % of the steps so far apart
    (`batchfit.core.LossChecks`) goes on the line as `train_loss`, the loss
    batchfit's own trainings judge a target by. Its time is not in the step's
    seconds. (`fit` does not show a callback its batches, so there is no
    default set.)
    rows: the rows of the training set `fit` draws its shuffled batches from
    (`batchfit.core.check_rows`): the lines carry it and batchfit corrects the
    noise scale for the finite data. Default None: no correction.
    """

    def __init__(self, batch_size=None, every=None, first=None, budget=None, file=None,
                 fixed_rows=None, rows=None):
        super().__init__()
        self.rows = core.check_rows(rows)
        self.batch_size = batch_size
        self.schedule = core.Schedule(every, first, budget)
        self.file = file
        self.steps = 0
        self.t0 = None
        self.fixed_rows = fixed_rows
        self.checks = core.LossChecks() if fixed_rows is not None else None

    def fixed_loss(self):
        """The mean loss over `fixed_rows` in inference mode."""
        x, y = self.fixed_rows
        n = len(y)
        total = 0.0
        for start in range(0, n, core.EVAL_CHUNK):
            xb, yb = x[start:start + core.EVAL_CHUNK], y[start:start + core.EVAL_CHUNK]
            pred = self.model(xb, training=False)
            loss = self.model.compute_loss(x=xb, y=yb, y_pred=pred, training=False)
            total += float(loss) * len(yb)
        return total / n if n else None

    def _state(self):
        return getattr(self.model, "_bf", None)

    def on_train_batch_begin(self, batch, logs=None):
        self.steps += 1
        st = self._state()
        if st is not None:
            st.measure.assign(self.schedule.measures(self.steps))
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        st = self._state()
        loss = noise = None
        samples = self.batch_size
        if st is not None:
            s = st.stats.numpy()  # waits for the step
            samples = int(s[1])
            loss = float(s[6])
            if s[0] > 0:
                noise = {"b_small": int(s[2]), "g_small_sq": float(s[3]),
                         "b_big": int(s[4]), "g_big_sq": float(s[5])}
                if s[7] > 0:
                    noise["preconditioned"] = {"g_small_sq": float(s[8]), "g_big_sq": float(s[9])}
                if self.rows is not None:
                    noise["rows"] = self.rows
        seconds = time.perf_counter() - self.t0
        self.schedule.record(self.steps, seconds, noise is not None)
        if samples is None:
            samples = 0
        train_loss = self.fixed_loss() if self.checks is not None and self.checks.due(self.steps) else None
        core.emit(self.steps, samples, seconds, loss=loss, noise=noise, train_loss=train_loss,
                  file=self.file if self.file is not None else sys.stdout)
