"""PyTorch Lightning's in-process batch-size finder on examples/run_pytorch.py's
network, under the same address-space limit `batchfit run --memory-limit` sets.

    python bench/lightning_search.py --memory-limit-kib 4000000 --init-val 64

The finder (`Tuner.scale_batch_size(mode="binsearch")`) doubles from
--init-val until a step runs out of memory, then bisects to adjacency, all in
one process. The limit is RLIMIT_AS set on this process before torch is
imported, as batchfit sets it on each trial's process. Each trial is counted
where Lightning runs it (`_try_loop_run`). Prints one JSON line: trials,
seconds, the batch found, and every trial in order ("x" = out of memory).
Lightning's own defaults are kept except max_val (8,192 by default: lifted so
the search is not capped) and margin (0: the batch found, as batchfit reports
it). PyTorch and Lightning are not dependencies of batchfit; never part of CI.
"""
import argparse
import json
import resource
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--memory-limit-kib", type=int, required=True)
    p.add_argument("--init-val", type=int, default=64)
    p.add_argument("--steps-per-trial", type=int, default=3)
    a = p.parse_args()
    limit = a.memory_limit_kib * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    import torch
    from torch import nn
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner
    import lightning.pytorch.tuner.batch_size_scaling as scaling

    sys.path.insert(0, "examples")
    from run_pytorch import make_model

    class RandomRows(torch.utils.data.Dataset):
        """Rows made on demand, so the data set holds no memory of its own
        (run_pytorch.py makes one random batch)."""

        def __len__(self):
            return 1 << 24

        def __getitem__(self, i):
            return torch.randn(26, 9, 9), torch.randn(8), torch.randn(1)

    class Module(pl.LightningModule):
        def __init__(self, batch_size):
            super().__init__()
            self.batch_size = batch_size
            self.net = make_model()

        def training_step(self, batch, _):
            image, features, target = batch
            return nn.functional.mse_loss(self.net(image, features), target)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(RandomRows(), batch_size=self.batch_size)

    trials = []
    run = scaling._try_loop_run
    module = Module(a.init_val)

    def counted(trainer, params):
        b = module.batch_size
        try:
            run(trainer, params)
        except RuntimeError:
            trials.append(f"{b}x")
            raise
        trials.append(str(b))

    scaling._try_loop_run = counted
    # The finder checkpoints the module into the trainer's folder: a throwaway one.
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         default_root_dir=tempfile.mkdtemp(),
                         enable_progress_bar=False, enable_model_summary=False, max_epochs=1)
    t0 = time.perf_counter()
    found = Tuner(trainer).scale_batch_size(
        module, mode="binsearch", init_val=a.init_val, steps_per_trial=a.steps_per_trial,
        max_val=1 << 24, margin=0.0)
    seconds = time.perf_counter() - t0
    print(json.dumps({"trials": len(trials), "seconds": round(seconds, 1), "batch_found": found,
                      "sequence": ",".join(trials)}))


if __name__ == "__main__":
    main()
