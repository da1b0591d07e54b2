"""Ray Train running xdevice: ``TorchTrainer`` starts the workers and their torch process group,
and each worker runs the training function of ``train_zoo.py`` (``xdevice.fit`` on the zoo mlp).

Ray sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in every worker and joins
torch's process group (gloo here, NCCL with ``use_gpu=True``) before the function runs;
``xdevice.fit`` finds the group joined and trains data parallel over it, each worker taking
its slice of every global batch, so all end with the weights one process reaches
(tests/training/test_ray_train.py). Needs ``pip install 'xdevice[ray]'`` (Ray Train).

    python deploy/training/ray_train.py --workers 2 --out /tmp/run
"""

from __future__ import annotations

import argparse
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def train_loop_per_worker(config: dict) -> None:
    """What each Ray worker runs: the same function ``xdevice launch`` runs in each process."""
    import ray.train
    from train_zoo import train

    result = train("torch", epochs=config["epochs"], out=config["out"])
    ray.train.report({"loss": result["steps"][-1], "world_size": result["size"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker (NCCL)")
    parser.add_argument("--out", default=None, help="write each rank's losses and final weights here (JSON)")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # the workers import train_zoo from this folder
    ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(FOLDER)}})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": args.epochs, "out": args.out},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu),
        run_config=RunConfig(name="xdevice-mlp", storage_path=args.out),
    )
    result = trainer.fit()
    print(f"Ray Train finished: {args.workers} workers, error: {result.error}", flush=True)
    ray.shutdown()
    if result.error:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
