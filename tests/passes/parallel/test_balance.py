"""`balance` prunes its search: the groups are those of the exhaustive search it replaced."""

import random

from graphllm.passes.parallel.partition import balance


def _exhaustive(weights: list[float], stages: int) -> list[tuple[int, int]]:
    """Every split point of every stage tried, the smallest j of a tie kept."""
    n, pre = len(weights), [0.0]
    for w in weights:
        pre.append(pre[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    out, i = [], n
    for k in range(stages, 0, -1):
        out.append((cut[k][i], i - 1))
        i = cut[k][i]
    return out[::-1]


def test_same_groups_as_the_exhaustive_search():
    rng = random.Random(0)
    for _ in range(2000):
        n = rng.randint(1, 40)
        stages = rng.randint(1, n)
        pick = rng.random()
        if pick < 0.3:  # ties and empty layers
            w = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)]
        elif pick < 0.4:
            w = [1.0] * n
        else:
            w = [rng.random() * rng.choice([1e-6, 1.0, 1e3]) for _ in range(n)]
        assert balance(w, stages) == _exhaustive(w, stages), (w, stages)


def test_a_deep_model_over_many_stages():
    w = [3.0] * 3 + [7.0] * 58  # DeepSeek-V3: 3 dense layers, 58 MoE ones
    for stages in (2, 4, 8, 16, 32, 61):
        assert balance(w, stages) == _exhaustive(w, stages)
