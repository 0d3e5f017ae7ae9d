"""Clip lengths for question 1's speech data: 1 to 15 s at 50 frames/s.

Durations are log-normal (median 6 s, sigma 0.45), as read-speech corpora's
are, cut to 1..15 s; written one length in frames per line.

    python3 examples/clip_lengths.py > examples/clips-50fps.txt
"""

import random
import sys

FPS = 50
N = 2000


def main(seed=0, n=N):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seconds = min(15.0, max(1.0, rng.lognormvariate(1.79, 0.45)))
        out.append(round(seconds * FPS))
    return out


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    print(f"# {N} clip lengths in frames at {FPS} frames/s, seed {seed}")
    for frames in main(seed):
        print(frames)
