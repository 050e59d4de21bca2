"""Ablation tables: train each row's variant (any stage, any scale), evaluate it, print the table in paper layout.

    python scripts/run_ablations.py --config configs/ablations/representation.yaml    # encoder/decoder variants
    python scripts/run_ablations.py --config configs/ablations/pipeline.yaml          # adaptation, cosine loss
    python scripts/run_ablations.py --config configs/ablations/pipeline.yaml --skip-train   # existing checkpoints
    python scripts/run_ablations.py --config configs/ablations/representation.yaml --table-only
    python scripts/run_ablations.py --config configs/tiny/ablations.yaml              # tiny, on a CPU

The program: animegamer/eval/ablations.py (``--help`` prints what it trains, evaluates and writes).
"""

from animegamer.eval.ablations import main

if __name__ == "__main__":
    main()
