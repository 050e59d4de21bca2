"""Stage (d): few-step distillation of the adapted decoder. The 50-step guided teacher -> a K-step (K <= 4) student
that samples without classifier-free guidance (one transformer call per step instead of two).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_d.py \\
        --config configs/stage_d.yaml

Every launch (the engines' accelerate configs, tiny models on a CPU, an exact resume), what one step computes
and what the run writes: ``--help``, the recipe animegamer/recipes/stage_d.py; the loop every stage shares:
animegamer/training/loop.py.
"""

from animegamer.recipes.stage_d import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

