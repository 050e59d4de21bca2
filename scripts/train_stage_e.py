"""Stage (e): a small causal decoder for the frozen CogVideoX VAE's latents (animegamer.models.causal_decoder).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_e.py \\
        --config configs/stage_e.yaml
    python scripts/train_stage_e.py --config configs/tiny/stage_e.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_e.py --config configs/stage_e.yaml --resume latest   # exact resume

What one step computes and what the run writes: the recipe, animegamer/recipes/stage_e.py (``--help`` prints
it); the loop every stage shares: animegamer/training/loop.py.
"""

from animegamer.recipes.stage_e import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

