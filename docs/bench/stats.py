"""Statistics shared by the bench scripts' tables (imported from docs/bench)."""
import math
import statistics


def median_ci(xs):
    """The median of xs and a distribution-free confidence interval of at
    least 95% for it: the order statistics that the sign test gives
    (x(k), x(n-k+1) with P(Binomial(n, 1/2) < k) <= 2.5%; for 20 values the
    6th and 15th). Below 6 values there is none, and the interval returned
    is the range (ci False). Returns (median, low, high, ci)."""
    xs, n = sorted(xs), len(xs)
    k, tail = 0, 0.0
    while tail + math.comb(n, k) / 2**n <= 0.025:
        tail += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return statistics.median(xs), xs[0], xs[-1], False
    return statistics.median(xs), xs[k - 1], xs[n - k], True


if __name__ == "__main__":
    # Self-check: python3 docs/bench/stats.py
    assert median_ci([3, 1, 2]) == (2, 1, 3, False)
    assert median_ci(list(range(1, 6))) == (3, 1, 5, False)  # 5 values: 2/32 > 2.5%
    assert median_ci(list(range(1, 7)))[1:] == (1, 6, True)  # 6: 1/64 <= 2.5%
    assert median_ci(list(range(1, 21)))[1:] == (6, 15, True)
    print("ok")
