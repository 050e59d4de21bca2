"""Stage (c): decoder adaptation. The frozen MLLM's predicted s_a of each training clip -> the real clip.

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_c.py \\
        --config configs/stage_c.yaml

Every launch (the engines' accelerate configs, tiny models on a CPU, an exact resume), what one step computes
and what the run writes: ``--help``, the recipe animegamer/recipes/stage_c.py; the loop every stage shares:
animegamer/training/loop.py.
"""

from animegamer.recipes.stage_c import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

