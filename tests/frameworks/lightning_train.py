"""Two CPU processes train a small model with Lightning's DDPStrategy over BACKEND; rank 0 saves
the final parameters to OUT.

    python lightning_train.py ddl|gloo OUT

Lightning starts the second process itself (it runs this script again with its own variables).
"""

import sys

import torch
import torch.nn as nn

import torch_ddl  # noqa: F401  registers 'ddl' (torch would also load it by the name)

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the standalone package
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main():
    backend, out = sys.argv[1], sys.argv[2]
    pl.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :4].argmax(dim=1)).long()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model = Model()
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_epochs=2, deterministic=True,
                         strategy=DDPStrategy(process_group_backend=backend),
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False)
    trainer.fit(model, data)
    assert torch.distributed.get_backend() == backend, torch.distributed.get_backend()
    if trainer.global_rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out)


if __name__ == "__main__":
    main()
