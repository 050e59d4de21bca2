"""Stage (b): train the next-game-state MLLM (Mistral + LoRA, query slots, resamplers) on windows of shots.

    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml scripts/train_stage_b.py \\
        --config configs/stage_b.yaml

Every launch (the engines' accelerate configs, tiny models on a CPU, an exact resume), what one step computes
and what the run writes: ``--help``, the recipe animegamer/recipes/stage_b.py; the loop every stage shares:
animegamer/training/loop.py.
"""

from animegamer.recipes.stage_b import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

