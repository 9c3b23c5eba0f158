"""Runs nanoGPT's train.py under another seed, changing nothing in nanoGPT's files.

    cd NANOGPT_CHECKOUT && python .../scripts/nanogpt_seeded.py SEED train.py [ARGS...]

train.py has no seed setting: it calls torch.manual_seed(1337 + seed_offset) once (seed_offset
is the DDP rank, 0 in a single process), and everything random after that (initial weights,
training batches, evaluation batches) comes from torch's generator. This wrapper shifts that one
call by SEED - 1, so seed 1 is nanoGPT exactly as published (1337) and seeds 2, 3 are 1338, 1339,
then runs train.py as `python train.py ARGS...` would.
"""

import os
import runpy
import sys

import torch


def run(seed: int, script: str, args: list[str]) -> None:
    seed_torch = torch.manual_seed
    seeded = []

    def shifted(value):
        seeded.append(value)
        return seed_torch(value + seed - 1)

    torch.manual_seed = shifted
    # As `python train.py` would have it: its folder first on the path (for `from model import
    # GPT`), its own name in argv[0] (configurator.py reads argv[1:]).
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    if len(seeded) != 1:
        sys.exit(f"nanogpt_seeded: {script} seeded torch {len(seeded)} times, expected once; "
                 "this wrapper does not know how to reseed it")


if __name__ == "__main__":
    if len(sys.argv) < 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit("usage: nanogpt_seeded.py SEED(>=1) train.py [ARGS...]")
    run(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
