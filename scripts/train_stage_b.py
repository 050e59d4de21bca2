"""Stage (b): train the next-game-state MLLM (Mistral + LoRA, query slots, resamplers) on windows of shots.

    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml scripts/train_stage_b.py \\
        --config configs/stage_b.yaml
    python scripts/train_stage_b.py --config configs/tiny/stage_b.yaml          # CPU, tiny Mistral
    python scripts/train_stage_b.py --config configs/stage_b.yaml --resume latest   # exact resume

What one step computes and what the run writes: the recipe, animegamer/recipes/stage_b.py (``--help`` prints
it); the loop every stage shares: animegamer/training/loop.py.
"""

from animegamer.recipes.stage_b import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

