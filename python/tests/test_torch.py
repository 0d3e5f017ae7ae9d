"""batchfit.torch; skipped where torch is not installed."""
import io
import json
import os
import sys
import unittest

try:
    import torch
except ImportError:  # the numpy-only run (CI)
    torch = None

if torch is not None:
    try:
        import batchfit.torch as bt
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import batchfit.torch as bt


def records(out):
    return [json.loads(t[len("BATCHFIT "):]) for t in out.getvalue().splitlines()]


@unittest.skipIf(torch is None, "torch is not installed")
class NoiseProbeTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(50, 6, dtype=torch.float64)
        self.y = torch.randint(0, 3, (50,))

    def model(self):
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()

    def micro_grads(self, m, loss_fn):
        """The gradients of the 8 micro-batches of 6 rows a batch of 50 is
        measured with, each flattened to one vector."""
        grads = []
        for i in range(8):
            sl = slice(6 * i, 6 * i + 6)
            g = torch.autograd.grad(loss_fn(m(self.x[sl]), self.y[sl]), list(m.parameters()))
            grads.append(torch.cat([t.reshape(-1) for t in g]))
        return grads

    def test_fields_match_direct_micro_batch_gradients(self):
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=1, file=out)
        loss_fn = torch.nn.functional.cross_entropy
        probe.step(lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
        rec = records(out)[0]
        # 50 = 8 x 6 + 2
        self.assertEqual(rec["noise"]["b_small"], 6)
        self.assertEqual(rec["noise"]["b_big"], 48)
        grads = self.micro_grads(m, loss_fn)
        small = float(sum((g * g).sum() for g in grads) / 8)
        mean = sum(grads) / 8
        big = float((mean * mean).sum())
        self.assertAlmostEqual(rec["noise"]["g_small_sq"], small, places=10)
        self.assertAlmostEqual(rec["noise"]["g_big_sq"], big, places=10)
        full = float(loss_fn(m(self.x), self.y).detach())
        self.assertAlmostEqual(rec["loss"], full, places=10)

    def check_identical_training(self, make_opt):
        loss_fn = torch.nn.functional.cross_entropy
        # Plain training: one backward over the whole batch.
        ref = self.model()
        opt = make_opt(ref.parameters())
        for _ in range(4):
            opt.zero_grad()
            loss_fn(ref(self.x), self.y).backward()
            opt.step()
        # Through the probe, measuring on every step.
        m = self.model()
        opt = make_opt(m.parameters())
        probe = bt.NoiseProbe(m, opt, every=1, file=io.StringIO())
        for _ in range(4):
            probe.step(lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
        for a, b in zip(ref.parameters(), m.parameters()):
            self.assertTrue(torch.allclose(a, b, rtol=1e-10, atol=1e-12), (a - b).abs().max())

    def test_training_unchanged_sgd(self):
        self.check_identical_training(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))

    def test_training_unchanged_adam(self):
        self.check_identical_training(lambda p: torch.optim.Adam(p, lr=1e-2))

    def test_adam_preconditioned_norms_match_direct_weighted_gradients(self):
        """Under Adam the line also carries the norms of g / (sqrt(v_hat) + eps),
        v_hat the optimizer's bias-corrected second moment with the step's own
        g^2 (the micro-batches' mean) folded in, as Adam folds before it divides."""
        m = self.model()
        opt = torch.optim.Adam(m.parameters(), lr=1e-2, eps=1e-6)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=3, file=out)
        loss_fn = torch.nn.functional.cross_entropy
        for _ in range(2):
            probe.step(lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
        grads = self.micro_grads(m, loss_fn)
        mean_sq = sum(g * g for g in grads) / 8
        # Adam's state after two updates, the third step's g^2 folded in.
        v = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in m.parameters()])
        v_hat = (0.999 * v + 0.001 * mean_sq) / (1 - 0.999 ** 3)
        w = 1.0 / (v_hat.sqrt() + 1e-6) ** 2
        probe.step(lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
        rec = records(out)[2]
        pre = rec["noise"]["preconditioned"]
        small = float(sum((g * g * w).sum() for g in grads) / 8)
        mean = sum(grads) / 8
        self.assertAlmostEqual(pre["g_small_sq"] / small, 1.0, places=9)
        self.assertAlmostEqual(pre["g_big_sq"] / float((mean * mean * w).sum()), 1.0, places=9)
        # SGD keeps no second moment: raw norms only.
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        out = io.StringIO()
        bt.NoiseProbe(m, opt, every=1, file=out).step(
            lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
        self.assertNotIn("preconditioned", records(out)[0]["noise"])

    def test_adam_weights_bound_a_coordinate_with_no_history(self):
        """A coordinate no earlier update moved has v = 0: dividing by v alone
        weighs a micro-batch that touches it by 1/eps^2; with the step's own
        g^2 folded in, its share of the mean squared norm is at most what
        Adam's step on it is, (1 - beta2^t) / (1 - beta2) at update t, and a
        coordinate with a steady gradient has a share of 1."""
        v = torch.tensor([0.25, 0.0], dtype=torch.float64)
        steps = 50.0
        v = v * (1 - 0.999 ** steps)  # 50 updates of g = (0.5, 0)
        mean_sq = torch.tensor([0.25, 1e-8 / 8], dtype=torch.float64)
        (w,) = bt.adam_weights([(v, 0.999, 1e-8, steps)], [mean_sq])
        share = w * mean_sq
        self.assertAlmostEqual(float(share[0]), 1.0, places=6)
        self.assertGreater(float(share[1]), 1.0)
        self.assertLess(float(share[1]), (1 - 0.999 ** (steps + 1)) / 0.001)
        # Before any update: the step divides by its own size.
        (w,) = bt.adam_weights([(None, 0.999, 1e-8, 0.0)], [mean_sq])
        for x in (w * mean_sq).tolist():
            self.assertAlmostEqual(x, 1.0, delta=2e-3)

    def test_schedule_and_lines(self):
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=3, file=out)
        for _ in range(7):
            probe.step(lambda xb, yb: torch.nn.functional.cross_entropy(m(xb), yb), self.x, self.y)
        recs = records(out)
        self.assertEqual([r["step"] for r in recs], list(range(1, 8)))
        self.assertEqual([("noise" in r) for r in recs], [False, False, True, False, False, True, False])
        for r in recs:
            self.assertEqual(r["samples"], 50)
            self.assertGreater(r["seconds"], 0)
            self.assertIn("loss", r)

    def test_rows_ride_on_the_measuring_lines(self):
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=2, file=out, rows=5000)
        for _ in range(4):
            probe.step(lambda xb, yb: torch.nn.functional.cross_entropy(m(xb), yb), self.x, self.y)
        noise = [r["noise"] for r in records(out) if "noise" in r]
        self.assertEqual([n["rows"] for n in noise], [5000, 5000])
        with self.assertRaises(ValueError):
            bt.NoiseProbe(m, opt, rows=0)

    def test_kwargs_free_inputs_and_dicts(self):
        # A dict of tensors is cut too; non-tensor arguments pass through unchanged.
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, b_small=10, every=1, file=out)
        seen = []

        def loss_of(batch, scale):
            seen.append(len(batch["x"]))
            return scale * torch.nn.functional.cross_entropy(m(batch["x"]), batch["y"])

        probe.step(loss_of, {"x": self.x, "y": self.y}, 1.0)
        self.assertEqual(seen, [10] * 5)
        # A tuple of inputs: each cut; a short list of parameters is not.
        seen.clear()

        def loss_of2(xs, y, weights):
            seen.append((len(xs[0]), len(xs[1]), len(weights)))
            return torch.nn.functional.cross_entropy(m(xs[0] + xs[1]), y) * weights[0]

        probe.step(loss_of2, (self.x, self.x), self.y, torch.ones(2, dtype=torch.float64))
        self.assertEqual(seen, [(10, 10, 2)] * 5)
        self.assertEqual(records(out)[0]["noise"]["b_big"], 50)

    def test_train_loss_on_given_rows_in_evaluation_mode(self):
        torch.manual_seed(2)
        m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3)).double()
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        out = io.StringIO()
        rows = (self.x[:20], self.y[:20])
        probe = bt.NoiseProbe(m, opt, every=0, fixed_rows=rows, file=out)
        loss_fn = torch.nn.functional.cross_entropy
        m.train()
        expected = []
        for _ in range(3):
            probe.step(lambda xb, yb: loss_fn(m(xb), yb), self.x, self.y)
            m.eval()
            with torch.no_grad():
                expected.append(float(loss_fn(m(rows[0]), rows[1])))
            m.train()
        recs = records(out)
        self.assertEqual([r["step"] for r in recs if "train_loss" in r], [1, 2, 3])
        for r, e in zip(recs, expected):
            self.assertAlmostEqual(r["train_loss"], e, places=12)
        self.assertTrue(m.training)  # the mode is restored
        # Dropout active: the step's loss is not the evaluated one.
        self.assertNotAlmostEqual(recs[0]["loss"], recs[0]["train_loss"], places=6)

    def test_train_loss_on_the_first_rows_trained_on(self):
        torch.manual_seed(3)
        x = torch.randn(1400, 6, dtype=torch.float64)
        y = torch.randint(0, 3, (1400,))
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=0, file=out)
        loss_fn = torch.nn.functional.cross_entropy
        for i in range(3):  # 400 rows a step: the 1,024 rows are held after step 3
            sl = slice(400 * i, 400 * i + 400)
            probe.step(lambda xb, yb: loss_fn(m(xb), yb), x[sl], y[sl])
        recs = records(out)
        self.assertEqual(["train_loss" in r for r in recs], [False, False, True])
        with torch.no_grad():
            direct = float(loss_fn(m(x[:1024]), y[:1024]))
        self.assertAlmostEqual(recs[2]["train_loss"], direct, places=12)
        # train_loss=False never evaluates.
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=0, fixed_rows=(x[:8], y[:8]), train_loss=False, file=out)
        probe.step(lambda xb, yb: loss_fn(m(xb), yb), x[:50], y[:50])
        self.assertNotIn("train_loss", records(out)[0])

    def test_batch_of_one_is_not_measured(self):
        m = self.model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        out = io.StringIO()
        probe = bt.NoiseProbe(m, opt, every=1, file=out)
        probe.step(lambda xb, yb: torch.nn.functional.cross_entropy(m(xb), yb), self.x[:1], self.y[:1])
        self.assertNotIn("noise", records(out)[0])


if __name__ == "__main__":
    unittest.main()
