"""Stage (e): a small causal decoder for the frozen CogVideoX VAE's latents (animegamer.models.causal_decoder).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_e.py \\
        --config configs/stage_e.yaml

Every launch (the engines' accelerate configs, tiny models on a CPU, an exact resume), what one step computes
and what the run writes: ``--help``, the recipe animegamer/recipes/stage_e.py; the loop every stage shares:
animegamer/training/loop.py.
"""

from animegamer.recipes.stage_e import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

