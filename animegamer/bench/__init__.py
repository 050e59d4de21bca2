"""Speed measurement for scripts/benchmark.py.

    timing.py    measure (warm-up, CUDA events / perf_counter), PeakMemory, matmul peak, FLOP counting
    models.py    full-size and tiny architectures, built with random weights straight on the device
    turn.py      one game turn, part by part, on our path and on the plain-library path
    training.py  stage (a) / (b) optimizer steps: clips/s, tokens/s, MFU
    report.py    benchmark.json -> markdown tables
"""
