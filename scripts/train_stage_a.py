"""Stage (a): train the action-aware encoder together with the CogVideoX decoder (LoRA + motion-level embedding).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_a.py \\
        --config configs/stage_a.yaml

Every launch (the engines' accelerate configs, tiny models on a CPU, an exact resume), what one step computes
and what the run writes: ``--help``, the recipe animegamer/recipes/stage_a.py; the loop every stage shares:
animegamer/training/loop.py.
"""

from animegamer.recipes.stage_a import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

