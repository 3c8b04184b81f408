"""One rank of a 2-process GRPOTrainer run (torchrun, gloo on CPU) for test_integrations_trl_ddp.

argv: the tiny model's folder (model/ and tokenizer/ inside) and an output folder. Rank 0's rlmon
callback writes contract lines to RLMON_SINK_JSONL; every rank pickles its own micro-batch
tensors, its reward-function calls and (rank 0) TRL's log history for the test to pool.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo's tests package

from rlmon.actors.integrations.trl import RlmonCallback
from tests.support import trl_support
from tests.support.trl_support import Truth, grpo_trainer


def score(completion: str) -> float:
    return completion.count("cat") + 0.1 * len(completion.split())


def main() -> None:
    tiny, out = Path(sys.argv[1]), Path(sys.argv[2])
    trl_support.tiny_model = lambda: (tiny / "model", tiny / "tokenizer")  # built by the test
    rank = int(os.environ["RANK"])
    truth = Truth(num_generations=4, eps_low=0.05, eps_high=0.05)
    trainer = grpo_trainer(out / f"trainer{rank}", truth.reward_fn(score),
                           per_device_train_batch_size=4, gradient_accumulation_steps=2,
                           num_iterations=2, beta=0.04, max_steps=4, learning_rate=5e-3,
                           epsilon=0.05)
    callback = RlmonCallback.attach(trainer, run="trl-ddp")
    truth.hook(trainer)
    trainer.train()
    with open(out / f"rank{rank}.pkl", "wb") as fh:
        pickle.dump({"micro": truth.micro, "generations": truth.generations,
                     "kl_times_ratio": truth.kl_times_ratio,
                     "log_history": trainer.state.log_history,
                     "world": trainer.accelerator.num_processes,
                     "fallbacks": callback.fallbacks}, fh)


if __name__ == "__main__":
    main()
