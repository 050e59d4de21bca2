"""Stage (a): train the action-aware encoder together with the CogVideoX decoder (LoRA + motion-level embedding).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_a.py \\
        --config configs/stage_a.yaml
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml scripts/train_stage_a.py \\
        --config configs/stage_a.yaml                                                # or fsdp_decoder.yaml, ...
    python scripts/train_stage_a.py --config configs/tiny/stage_a.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_a.py --config configs/stage_a.yaml --resume latest   # exact resume

What one step computes and what the run writes: the recipe, animegamer/recipes/stage_a.py (``--help`` prints
it); the loop every stage shares: animegamer/training/loop.py.
"""

from animegamer.recipes.stage_a import main
from animegamer.training.program import run_program

if __name__ == "__main__":
    run_program(main)

