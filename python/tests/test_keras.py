"""batchfit.keras; skipped where keras with the TensorFlow backend is not installed."""
import io
import json
import os
import sys
import unittest

try:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    if keras.backend.backend() != "tensorflow":
        keras = None
except ImportError:  # the numpy-only run (CI)
    keras = None

if keras is not None:
    import numpy as np
    try:
        from batchfit.keras import BatchfitLines, NoiseModel
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from batchfit.keras import BatchfitLines, NoiseModel


def records(out):
    return [json.loads(t[len("BATCHFIT "):]) for t in out.getvalue().splitlines()]


@unittest.skipIf(keras is None, "keras with the TensorFlow backend is not installed")
class NoiseModelTest(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(100, 6)).astype("float32")
        self.y = rng.integers(0, 3, size=100)

    def inner(self):
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def micro_grads(self, inner):
        """The gradients of the 8 micro-batches of 6 rows a batch of 48 or 50
        is measured with, each flattened to one float64 vector."""
        grads = []
        for i in range(8):
            with tf.GradientTape() as tape:
                loss = self.loss()(self.y[6 * i:6 * i + 6], inner(self.x[6 * i:6 * i + 6]))
            g = tape.gradient(loss, inner.trainable_weights)
            grads.append(np.concatenate([t.numpy().ravel() for t in g]).astype("float64"))
        return grads

    def test_fields_match_direct_micro_batch_gradients(self):
        inner = self.inner()
        m = NoiseModel(inner)
        m.compile(optimizer=keras.optimizers.SGD(0.0), loss=self.loss())
        out = io.StringIO()
        m.fit(self.x[:50], self.y[:50], batch_size=50, epochs=1, verbose=0, shuffle=False,
              callbacks=[BatchfitLines(every=1, file=out)])
        rec = records(out)[0]
        self.assertEqual(rec["samples"], 50)
        self.assertEqual(rec["noise"]["b_small"], 6)  # 50 = 8 x 6 + 2
        self.assertEqual(rec["noise"]["b_big"], 48)
        grads = self.micro_grads(inner)
        small = np.mean([g @ g for g in grads])
        mean = np.mean(grads, axis=0)
        self.assertAlmostEqual(rec["noise"]["g_small_sq"] / small, 1.0, places=5)
        self.assertAlmostEqual(rec["noise"]["g_big_sq"] / (mean @ mean), 1.0, places=5)
        full = float(self.loss()(self.y[:50], inner(self.x[:50])))
        self.assertAlmostEqual(rec["loss"], full, places=5)

    def test_training_unchanged(self):
        ref = self.inner()
        ref.compile(optimizer=keras.optimizers.Adam(1e-2), loss=self.loss())
        ref.fit(self.x, self.y, batch_size=30, epochs=2, verbose=0, shuffle=False)
        inner = self.inner()
        m = NoiseModel(inner)
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss=self.loss())
        out = io.StringIO()
        m.fit(self.x, self.y, batch_size=30, epochs=2, verbose=0, shuffle=False,
              callbacks=[BatchfitLines(every=1, file=out)])
        recs = records(out)
        # 100 = 30 + 30 + 30 + 10 per epoch: every step measured, the last batch too.
        self.assertEqual([r["samples"] for r in recs], [30, 30, 30, 10] * 2)
        self.assertTrue(all("noise" in r for r in recs))
        self.assertEqual(recs[3]["noise"]["b_small"], 1)
        self.assertEqual(recs[3]["noise"]["b_big"], 8)
        for a, b in zip(ref.get_weights(), inner.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    def test_adam_preconditioned_norms_match_direct_weighted_gradients(self):
        """Under Adam a measuring step also carries the norms weighted by
        1 / (sqrt(v) + eps)^2, v Adam's second moment with the step's own g^2
        (the micro-batches' mean) folded in, as Adam folds before it divides."""
        inner = self.inner()
        m = NoiseModel(inner)
        opt = keras.optimizers.Adam(1e-2, epsilon=1e-6)
        m.compile(optimizer=opt, loss=self.loss())
        out = io.StringIO()
        # Two ordinary steps, then a measuring one on the first 48 rows.
        x = np.concatenate([self.x[:48], self.x[:48], self.x[:48]])
        y = np.concatenate([self.y[:48], self.y[:48], self.y[:48]])
        lines = BatchfitLines(every=3, file=out)
        m.fit(x[:96], y[:96], batch_size=48, epochs=1, verbose=0, shuffle=False, callbacks=[lines])
        v = np.concatenate([
            opt._velocities[opt._get_variable_index(v)].numpy().astype("float64").ravel()
            for v in inner.trainable_weights])
        grads = self.micro_grads(inner)
        mean_sq = np.mean([g * g for g in grads], axis=0)
        w = 1.0 / (np.sqrt(0.999 * v + 0.001 * mean_sq) + 1e-6) ** 2
        m.fit(x[96:], y[96:], batch_size=48, epochs=1, verbose=0, shuffle=False, callbacks=[lines])
        rec = records(out)[2]
        pre = rec["noise"]["preconditioned"]
        small = np.mean([(g * g * w).sum() for g in grads])
        mean = np.mean(grads, axis=0)
        self.assertAlmostEqual(pre["g_small_sq"] / small, 1.0, places=4)
        self.assertAlmostEqual(pre["g_big_sq"] / (mean * mean * w).sum(), 1.0, places=4)
        # SGD keeps no second moment: raw norms only.
        m = NoiseModel(self.inner())
        m.compile(optimizer="sgd", loss=self.loss())
        out = io.StringIO()
        m.fit(self.x[:48], self.y[:48], batch_size=48, epochs=1, verbose=0,
              callbacks=[BatchfitLines(every=1, file=out)])
        self.assertNotIn("preconditioned", records(out)[0]["noise"])

    def test_schedule(self):
        m = NoiseModel(self.inner(), k=4)
        m.compile(optimizer="sgd", loss=self.loss())
        out = io.StringIO()
        m.fit(self.x, self.y, batch_size=20, epochs=1, verbose=0,
              callbacks=[BatchfitLines(every=2, file=out)])
        recs = records(out)
        self.assertEqual([r["step"] for r in recs], [1, 2, 3, 4, 5])
        self.assertEqual([("noise" in r) for r in recs], [False, True, False, True, False])
        self.assertEqual(recs[1]["noise"]["b_small"], 5)
        self.assertEqual(recs[1]["noise"]["b_big"], 20)

    def test_train_loss_on_given_rows_in_inference_mode(self):
        keras.utils.set_random_seed(1)
        inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.5), keras.layers.Dense(3)])
        m = NoiseModel(inner)
        m.compile(optimizer="sgd", loss=self.loss())
        out = io.StringIO()
        rows = (self.x[:30], self.y[:30])
        m.fit(self.x, self.y, batch_size=20, epochs=1, verbose=0, shuffle=False,
              callbacks=[BatchfitLines(every=0, file=out, fixed_rows=rows)])
        recs = records(out)
        self.assertEqual([("train_loss" in r) for r in recs], [True] * 5)
        # After the last step: the rows' mean loss with dropout off.
        direct = float(self.loss()(rows[1], inner(rows[0], training=False)))
        self.assertAlmostEqual(recs[-1]["train_loss"], direct, places=5)


if __name__ == "__main__":
    unittest.main()
