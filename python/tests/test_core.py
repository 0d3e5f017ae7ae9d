"""batchfit.core with numpy only: python3 -m unittest discover -s python/tests"""
import io
import json
import math
import os
import sys
import unittest

import numpy as np

try:
    from batchfit import core  # the installed package (pip install ./python)
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from batchfit import core


def two_batch(b_small, g_small_sq, b_big, g_big_sq):
    """The unbiased estimators batchfit applies (crates/tune/src/noise.rs, two_batch)."""
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


class EstimatorInputs(unittest.TestCase):
    """Per-sample gradients G + e, e ~ N(0, Sigma) with Sigma diagonal: the true
    |G|^2 and tr(Sigma) are known; the reported fields, put through batchfit's
    two formulas and averaged over many steps, must recover them."""

    def run_draws(self, batch, k, draws, seed, b_small=None):
        rng = np.random.default_rng(seed)
        d = 40
        G = rng.normal(0.0, 0.3, size=d)
        sd = rng.uniform(0.5, 2.0, size=d)  # Sigma = diag(sd^2)
        true_g2 = float(G @ G)
        true_tr = float((sd ** 2).sum())
        split = core.plan_split(batch, k=k, b_small=b_small)
        g2s, trs = [], []
        for _ in range(draws):
            per_sample = G + rng.normal(size=(batch, d)) * sd
            micro = [per_sample[a:b].mean(axis=0) for a, b in split.chunks()[: split.k]]
            fields = core.noise_from_grads(micro, split.b_small)
            self.assertEqual(fields["b_small"], split.b_small)
            self.assertEqual(fields["b_big"], split.b_big)
            g2, tr = two_batch(fields["b_small"], fields["g_small_sq"],
                               fields["b_big"], fields["g_big_sq"])
            g2s.append(g2)
            trs.append(tr)
        return true_g2, true_tr, np.array(g2s), np.array(trs)

    def check(self, true_g2, true_tr, g2s, trs, rel):
        # Within `rel`, and within 4 standard errors (so the test is not flaky).
        for est, truth, name in ((g2s, true_g2, "|G|^2"), (trs, true_tr, "tr(Sigma)")):
            m = est.mean()
            se = est.std(ddof=1) / math.sqrt(len(est))
            self.assertLess(abs(m - truth), max(4 * se, 1e-12), "%s: %g vs %g" % (name, m, truth))
            self.assertLess(abs(m - truth) / truth, rel, "%s: %g vs %g" % (name, m, truth))

    def test_recovers_true_values_default_split(self):
        self.check(*self.run_draws(batch=128, k=8, draws=3000, seed=1), rel=0.05)

    def test_recovers_true_values_uneven_batch(self):
        # 100 = 8 x 12 + 4: the remainder is not part of the measurement.
        true_g2, true_tr, g2s, trs = self.run_draws(batch=100, k=None, draws=3000, seed=2)
        self.check(true_g2, true_tr, g2s, trs, rel=0.05)

    def test_recovers_true_values_user_b_small(self):
        self.check(*self.run_draws(batch=64, k=None, b_small=4, draws=3000, seed=3), rel=0.05)

    def test_naive_norms_are_biased(self):
        # The raw |G_big|^2 overestimates |G|^2 by tr(Sigma)/B_big: why the
        # estimator needs both batch sizes.
        rng = np.random.default_rng(4)
        d, batch = 30, 64
        G = np.full(d, 0.1)
        big = []
        for _ in range(2000):
            per_sample = G + rng.normal(size=(batch, d))
            micro = [per_sample[a:b].mean(axis=0) for a, b in core.split_batch(batch)]
            big.append(core.noise_from_grads(micro, batch // 8)["g_big_sq"])
        expected = G @ G + d / batch
        self.assertLess(abs(np.mean(big) - expected) / expected, 0.05)
        self.assertGreater(np.mean(big), 1.5 * (G @ G))

    def test_fields_from_norms(self):
        g = [np.array([1.0, 0.0]), np.array([0.0, 2.0]), np.array([1.0, 2.0]), np.array([2.0, 0.0])]
        f = core.noise_from_grads(g, 5)
        self.assertEqual(f["b_small"], 5)
        self.assertEqual(f["b_big"], 20)
        self.assertAlmostEqual(f["g_small_sq"], (1 + 4 + 5 + 4) / 4)
        self.assertAlmostEqual(f["g_big_sq"], 1.0 ** 2 + 1.0 ** 2)
        same = core.noise_fields([1, 4, 5, 4], 2.0, 5, 20)
        self.assertEqual(f, same)

    def test_per_parameter_lists(self):
        # Gradients as lists of per-parameter arrays give the same fields as flattened ones.
        rng = np.random.default_rng(5)
        parts = [[rng.normal(size=(3, 2)), rng.normal(size=4)] for _ in range(4)]
        flat = [np.concatenate([a.ravel(), b]) for a, b in parts]
        a = core.noise_from_grads(parts, 3)
        b = core.noise_from_grads(flat, 3)
        for key in a:
            self.assertAlmostEqual(a[key], b[key])

    def test_fields_reject_inconsistent_sizes(self):
        with self.assertRaises(ValueError):
            core.noise_fields([1.0, 2.0], 1.0, 4, 12)
        with self.assertRaises(ValueError):
            core.noise_fields([], 1.0, 4, 0)
        self.assertIsNone(core.noise_fields([1.0, float("nan")], 1.0, 4, 8))


class Line(unittest.TestCase):
    def test_exact_field_names(self):
        noise = core.noise_fields([0.02, 0.0046], 0.0045, 64, 128)
        text = core.line(12, 128, 0.031, loss=0.52, noise=noise)
        self.assertTrue(text.startswith("BATCHFIT {"))
        self.assertNotIn("\n", text)
        rec = json.loads(text[len("BATCHFIT "):])
        self.assertEqual(list(rec), ["step", "samples", "seconds", "loss", "noise"])
        self.assertEqual(list(rec["noise"]), ["b_small", "g_small_sq", "b_big", "g_big_sq"])
        self.assertEqual(rec["step"], 12)
        self.assertEqual(rec["samples"], 128)
        self.assertEqual(rec["seconds"], 0.031)
        self.assertEqual(rec["loss"], 0.52)
        self.assertEqual(rec["noise"]["b_small"], 64)
        self.assertEqual(rec["noise"]["b_big"], 128)
        self.assertIsInstance(rec["noise"]["b_small"], int)
        self.assertAlmostEqual(rec["noise"]["g_small_sq"], 0.0123)
        self.assertEqual(rec["noise"]["g_big_sq"], 0.0045)

    def test_example_of_the_docs(self):
        text = core.line(12, 128, 0.031, loss=0.52, noise={
            "b_small": 16, "g_small_sq": 0.0123, "b_big": 128, "g_big_sq": 0.0045})
        self.assertEqual(text, 'BATCHFIT {"step": 12, "samples": 128, "seconds": 0.031, "loss": 0.52, '
                               '"noise": {"b_small": 16, "g_small_sq": 0.0123, "b_big": 128, "g_big_sq": 0.0045}}')

    def test_preconditioned_norms_ride_along(self):
        noise = {"b_small": 16, "g_small_sq": 0.0123, "b_big": 128, "g_big_sq": 0.0045,
                 "preconditioned": {"g_small_sq": 41.0, "g_big_sq": 7.5}}
        rec = json.loads(core.line(12, 128, 0.031, noise=noise)[len("BATCHFIT "):])
        self.assertEqual(rec["noise"]["preconditioned"], {"g_small_sq": 41.0, "g_big_sq": 7.5})
        # A value that is not finite drops the preconditioned pair, not the line.
        noise["preconditioned"]["g_big_sq"] = float("nan")
        rec = json.loads(core.line(12, 128, 0.031, noise=noise)[len("BATCHFIT "):])
        self.assertNotIn("preconditioned", rec["noise"])
        self.assertEqual(rec["noise"]["g_big_sq"], 0.0045)

    def test_rows_ride_along_when_they_can_hold_the_batch(self):
        noise = {"b_small": 16, "g_small_sq": 0.0123, "b_big": 128, "g_big_sq": 0.0045, "rows": 5000}
        rec = json.loads(core.line(12, 128, 0.031, noise=noise)[len("BATCHFIT "):])
        self.assertEqual(rec["noise"]["rows"], 5000)
        # Fewer rows than the big batch is no data set it was drawn from.
        noise["rows"] = 100
        rec = json.loads(core.line(12, 128, 0.031, noise=noise)[len("BATCHFIT "):])
        self.assertNotIn("rows", rec["noise"])
        self.assertEqual(core.check_rows(None), None)
        self.assertEqual(core.check_rows(5000), 5000)
        for bad in (0, -3, 2.5, True, "many"):
            with self.assertRaises((ValueError, TypeError)):
                core.check_rows(bad)

    def test_optional_fields_left_out(self):
        rec = json.loads(core.line(3, 32, 0.5)[len("BATCHFIT "):])
        self.assertEqual(rec, {"step": 3, "samples": 32, "seconds": 0.5})

    def test_non_finite_values_keep_the_line_json(self):
        bad = {"b_small": 4, "g_small_sq": float("inf"), "b_big": 32, "g_big_sq": 1.0}
        text = core.line(1, 32, 0.1, loss=float("nan"), noise=bad)
        rec = json.loads(text[len("BATCHFIT "):])  # strict JSON: no NaN, no Infinity
        self.assertEqual(rec, {"step": 1, "samples": 32, "seconds": 0.1})
        self.assertNotIn("NaN", text)

    def test_train_loss_field(self):
        rec = json.loads(core.line(4, 32, 0.5, loss=0.9, train_loss=0.7)[len("BATCHFIT "):])
        self.assertEqual(rec, {"step": 4, "samples": 32, "seconds": 0.5, "loss": 0.9,
                               "train_loss": 0.7})
        rec = json.loads(core.line(4, 32, 0.5, train_loss=float("inf"))[len("BATCHFIT "):])
        self.assertNotIn("train_loss", rec)

    def test_numpy_scalars(self):
        rec = json.loads(core.line(np.int64(2), np.int32(8), np.float32(0.25),
                                   loss=np.float64(1.5))[len("BATCHFIT "):])
        self.assertEqual(rec, {"step": 2, "samples": 8, "seconds": 0.25, "loss": 1.5})

    def test_emit_writes_one_line_and_flushes(self):
        class Out(io.StringIO):
            flushed = 0

            def flush(self):
                Out.flushed += 1
                super().flush()

        out = Out()
        text = core.emit(1, 16, 0.01, loss=2.0, file=out)
        self.assertEqual(out.getvalue(), text + "\n")
        self.assertGreaterEqual(Out.flushed, 1)


class ScheduleTest(unittest.TestCase):
    def run_adaptive(self, ordinary, measuring, steps, **kw):
        s = core.Schedule(**kw)
        got = []
        for t in range(1, steps + 1):
            m = s.measures(t)
            if m:
                got.append(t)
            s.record(t, measuring if m else ordinary, m)
        return s, got

    def test_adaptive_default(self):
        # A measuring step costing 3 ordinary steps spends 2: one more when
        # 0.05 x step covers the extra so far plus 2, i.e. every 40 steps.
        s, got = self.run_adaptive(0.01, 0.03, 200, budget=0.05)
        self.assertEqual(got, [10, 80, 120, 160, 200])
        self.assertAlmostEqual(s.cost(), 3.0)
        # The measurements' extra time is about the budget.
        extra = len(got) * (0.03 - 0.01)
        self.assertLess(extra / (200 * 0.01), 0.05 + 1e-9)

    def test_adaptive_small_batch_costs_more(self):
        # c = 11 (k = 8 tiny micro-batches): one measurement per 200 steps.
        _, got = self.run_adaptive(0.001, 0.011, 700, budget=0.05)
        self.assertEqual(got, [10, 400, 600])

    def test_adaptive_stays_within_budget(self):
        for c in (1.5, 2.0, 4.0, 9.0, 30.0):
            _, got = self.run_adaptive(1.0, c, 3000)  # the default budget
            b = core.DEFAULT_BUDGET
            for n, step in enumerate(got[1:], start=2):
                self.assertLessEqual(n * (c - 1.0), b * step + 1e-6, (c, step))
            self.assertGreater(len(got) * (c - 1.0), b * 3000 - 2 * (c - 1.0), c)

    def test_adaptive_budget_and_first(self):
        _, got = self.run_adaptive(1.0, 2.0, 30, budget=0.25, first=3)
        # no ordinary step timed before step 3 (1 and 2 are warm-up): then `first` later
        self.assertEqual(got, [3, 6, 8, 12, 16, 20, 24, 28])

    def test_adaptive_without_timings_keeps_first_as_gap(self):
        s = core.Schedule()
        self.assertFalse(s.measures(9))
        self.assertTrue(s.measures(10))
        s.record(10, 1.0, True)  # no ordinary step recorded yet
        self.assertEqual([t for t in range(11, 40) if s.measures(t)][:1], [20])

    def test_adaptive_skipped_measurement_stays_due(self):
        # A step that was due but could not measure (a batch of 1) leaves the next one due.
        s = core.Schedule()
        s.record(10, 0.01, False)
        self.assertTrue(s.measures(11))

    def test_run_noise_trial_env(self):
        old = os.environ.get(core.NOISE_EVERY_ENV)
        try:
            os.environ[core.NOISE_EVERY_ENV] = "1"
            s = core.Schedule()
            self.assertEqual([t for t in range(1, 6) if s.measures(t)], [1, 2, 3, 4, 5])
            os.environ[core.NOISE_EVERY_ENV] = "3"
            self.assertEqual([t for t in range(1, 8) if core.Schedule().measures(t)], [1, 4, 7])
            # The caller's own rate wins.
            self.assertEqual([t for t in range(1, 8) if core.Schedule(every=5).measures(t)], [5])
            os.environ[core.NOISE_EVERY_ENV] = "often"
            self.assertRaises(ValueError, core.Schedule)
        finally:
            if old is None:
                os.environ.pop(core.NOISE_EVERY_ENV, None)
            else:
                os.environ[core.NOISE_EVERY_ENV] = old

    def test_every_and_first(self):
        s = core.Schedule(every=10, first=3)
        self.assertEqual([t for t in range(1, 40) if s.measures(t)], [3, 13, 23, 33])
        s = core.Schedule(every=1)
        self.assertEqual([t for t in range(1, 5) if s.measures(t)], [1, 2, 3, 4])

    def test_never(self):
        s = core.Schedule(every=0)
        self.assertFalse(any(s.measures(t) for t in range(1, 100)))

    def test_rejects(self):
        with self.assertRaises(ValueError):
            core.Schedule(every=-1)
        with self.assertRaises(ValueError):
            core.Schedule(every=5, first=0)
        with self.assertRaises(ValueError):
            core.Schedule(budget=0)


class LossChecksTest(unittest.TestCase):
    def test_every_step_then_five_percent_apart(self):
        c = core.LossChecks()
        due = [t for t in range(1, 4001) if c.due(t)]
        self.assertEqual(due[:20], list(range(1, 21)))
        for a, b in zip(due, due[1:]):
            self.assertGreaterEqual(b - a, max(1, math.ceil(0.05 * a)))
            self.assertLessEqual(b - a, max(1, math.ceil(0.05 * a)))
        # A long run stays cheap: about 46 evaluations per tenfold of steps.
        self.assertLess(len(due), 140)
        self.assertGreater(len(due), 100)

    def test_a_missed_step_stays_due(self):
        c = core.LossChecks()
        self.assertTrue(c.due(1))
        self.assertTrue(c.due(5))  # steps 2-4 were never asked
        self.assertFalse(core.LossChecks(spacing=0.5).due(0))

    def test_rejects(self):
        with self.assertRaises(ValueError):
            core.LossChecks(spacing=-1)


class SplitTest(unittest.TestCase):
    def test_even(self):
        s = core.plan_split(128)
        self.assertEqual(s, core.Split(16, 8, 128, 0))
        self.assertEqual(s.chunks(), [(16 * i, 16 * i + 16) for i in range(8)])

    def test_uneven_keeps_every_sample(self):
        for batch in range(2, 300):
            for k in (None, 2, 3, 8):
                chunks = core.split_batch(batch, k=k)
                # Contiguous, in order, covering the batch exactly once.
                self.assertEqual(chunks[0][0], 0)
                self.assertEqual(chunks[-1][1], batch)
                for (a, b), (c, _) in zip(chunks, chunks[1:]):
                    self.assertEqual(b, c)
                s = core.plan_split(batch, k=k)
                kk = 8 if k is None else k
                if batch < 2:
                    self.assertIsNone(s)
                    continue
                # the largest b_small = floor(B / k) >= 1
                self.assertEqual(s.b_small, max(1, batch // kk))
                self.assertEqual(s.k, min(kk, batch // s.b_small))
                self.assertEqual(s.b_big, s.k * s.b_small)
                self.assertLess(s.remainder, kk if batch >= kk else 1)  # B mod k
                self.assertAlmostEqual(sum(s.weights()), 1.0)

    def test_uneven_example(self):
        s = core.plan_split(100)
        self.assertEqual(s, core.Split(12, 8, 96, 4))
        self.assertEqual(s.chunks()[-2:], [(84, 96), (96, 100)])
        self.assertEqual(s.weights(), [0.12] * 8 + [0.04])

    def test_small_batches(self):
        self.assertIsNone(core.plan_split(0))
        self.assertIsNone(core.plan_split(1))
        self.assertEqual(core.plan_split(2), core.Split(1, 2, 2, 0))
        self.assertEqual(core.plan_split(5), core.Split(1, 5, 5, 0))
        self.assertEqual(core.split_batch(1), [(0, 1)])

    def test_user_b_small_and_k(self):
        self.assertEqual(core.plan_split(64, b_small=4), core.Split(4, 16, 64, 0))
        self.assertEqual(core.plan_split(64, b_small=4, k=8), core.Split(4, 8, 32, 32))
        self.assertEqual(core.plan_split(70, b_small=32), core.Split(32, 2, 64, 6))
        self.assertIsNone(core.plan_split(40, b_small=32))
        self.assertEqual(core.plan_split(64, k=4), core.Split(16, 4, 64, 0))
        with self.assertRaises(ValueError):
            core.plan_split(64, k=1)
        with self.assertRaises(ValueError):
            core.plan_split(64, b_small=0)


if __name__ == "__main__":
    unittest.main()
