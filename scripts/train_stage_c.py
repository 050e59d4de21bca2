"""Stage (c): decoder adaptation. The frozen MLLM's predicted s_a of each training clip -> the real clip.

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_c.py \\
        --config configs/stage_c.yaml
    python scripts/train_stage_c.py --config configs/tiny/stage_c.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_c.py --config configs/stage_c.yaml --resume latest   # exact resume

What one step computes and what the run writes: the recipe, animegamer/recipes/stage_c.py (``--help`` prints
it); the loop every stage shares: animegamer/training/loop.py.
"""

from animegamer.recipes.stage_c import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

