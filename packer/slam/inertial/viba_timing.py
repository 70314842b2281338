"""The camera-IMU clock offset and the rolling-shutter readout that the visual-inertial
bundle adjustment fits best, searched as two nuisance parameters of its cost.

Why: a model mapped again on the gyro's rotations (`gyro_repair`) keeps the clock
offset it started from; nothing in its adjustment moves it. On the every-effect
bench sessions the repaired models' offsets were 0-8 ms off (20 ms on seed 5, 18 on
62), where a first-try model's, aligned on its own rotations, is within 0.6 ms. At
fast turns a few ms is what the IMU factors cannot absorb: seed 44's chi^2/dof was
2.6 (refused over 2) at 8.8 ms off, 0.4 at the true offset, and seed 32's scale moved
0.35% per ms. VINS-Mono and OpenVINS estimate the offset inside the solve; GTSAM's
preintegrated factors have no time variable, so here the cost is profiled: each
candidate is a quick solve (`quick`), the minimum found by walking downhill and a
parabola through the last three points (`profile_min`), the offset, then the readout
(a sensor's own, 0-33 ms on phones), then the offset again (they trade off a little)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

READOUTS = (0.0, 0.012, 0.024, 0.036)  # s, the rolling-shutter readouts tried (phones: ~10-30 ms)
OFFSET_STEP = 0.004  # s, the walk's step: the cost of every-effect seeds 32 and 44 is near a parabola over +-8 ms


def parabola_tip(x: Sequence[float], y: Sequence[float]) -> float:
    """The vertex of the parabola through three points with x[1] lowest in y, kept
    within [x[0], x[2]] (the middle point when the three are not convex)."""
    x0, x1, x2 = (float(v) for v in x)
    y0, y1, y2 = (float(v) for v in y)
    den = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
    if not a > 0:
        return x1
    return float(np.clip(-b / (2 * a), min(x0, x2), max(x0, x2)))


def profile_min(cost: Callable[[float], float], x0: float, step: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] where `cost` is lowest, from `x0`: steps downhill until the
    cost rises again (or the bound), then `parabola_tip` of the last three. Assumes
    one minimum within reach (a cost that is inf everywhere returns x0)."""
    seen: dict[float, float] = {}

    def c(x: float) -> float:
        x = round(float(np.clip(x, lo, hi)), 9)
        if x not in seen:
            seen[x] = float(cost(x))
        return seen[x]

    left, mid, right = c(x0 - step), c(x0), c(x0 + step)
    if not np.isfinite(mid) and not (np.isfinite(left) or np.isfinite(right)):
        return x0
    x = x0
    direction = -1.0 if left < right else 1.0
    while True:
        nxt = float(np.clip(x + direction * step, lo, hi))
        if c(nxt) >= c(x) or nxt == x:
            break
        x = nxt
    a, b = float(np.clip(x - step, lo, hi)), float(np.clip(x + step, lo, hi))
    if a == x or b == x:
        return x
    return parabola_tip((a, x, b), (c(a), c(x), c(b)))


def best_timing(quick: Callable[[float, float], tuple[float, float]], readout: float | None, max_shift: float,
                failed: type[Exception] = ValueError, step: float = OFFSET_STEP) -> tuple[float, float]:
    """(clock shift in s, readout in s) lowest in the whole cost of `quick(readout,
    shift)` (-> (visual chi^2 per row, whole cost); a solve raising `failed` costs inf):
    the shift within +-max_shift, at `readout` or, when that is None (unknown), at
    READOUTS[1]; then the readout among READOUTS (between them by a parabola); then the
    shift again."""
    def cost(shift: float, rs: float) -> float:
        try:
            return quick(rs, shift)[1]
        except failed:
            return float("inf")

    r0 = READOUTS[1] if readout is None else readout
    shift = profile_min(lambda d: cost(d, r0), 0.0, step, -max_shift, max_shift)
    if readout is not None:
        return shift, readout
    r0 = grid_min(lambda r: cost(shift, r), READOUTS, reach=1.0)
    shift = profile_min(lambda d: cost(d, r0), shift, step / 2, -max_shift, max_shift)
    return shift, float(max(r0, 0.0))


LEVER_STEP = 0.005  # m, the lever arm's walk per axis


def best_lever(cost: Callable[[np.ndarray], float], r0: np.ndarray, reach: float,
               failed: type[Exception] = ValueError, step: float = LEVER_STEP) -> np.ndarray:
    """The IMU's position in the camera frame (m) lowest in `cost(r)` (a quick solve's
    whole cost with the accelerometer moved to the camera centre from r; one raising
    `failed` costs inf), from `r0` (the windowed solve's), one axis after the other by
    `profile_min`, each within +-`reach` of r0. Why: the windowed solve places it on the
    SfM model, whose scale drifts at vigorous speeds (fast-phone seed 3: 6% over 30 s),
    and a lever arm 6 mm off there moved the adjustment's scale by 0.5%; the adjustment,
    on the poses it straightens, finds it to ~1 mm."""
    r = np.asarray(r0, dtype=np.float64).copy()

    def c(r_try: np.ndarray) -> float:
        try:
            return float(cost(r_try))
        except failed:
            return float("inf")

    for axis in range(3):
        def along(x: float, axis: int = axis) -> float:
            r_try = r.copy()
            r_try[axis] = x
            return c(r_try)

        r[axis] = profile_min(along, float(r[axis]), step, float(r0[axis]) - reach, float(r0[axis]) + reach)
    return r


def estimate_readout(cost: Callable[[float], float], readouts: Sequence[float] = READOUTS) -> float:
    """The readout lowest in `cost` (the visual chi^2 of a quick solve with the
    observations corrected for it), refined by a parabola through the best and its
    neighbours, within half a step of the best (the grid's resolution). A wrong readout
    costs: 20 ms assumed on a global shutter moved a fast session's scale by 1%, none
    where there is one by 0.8-2.5%."""
    return grid_min(cost, readouts, reach=0.5)


def grid_min(cost: Callable[[float], float], grid: Sequence[float], reach: float) -> float:
    """The point of `grid` (increasing) lowest in `cost`, moved toward the vertex of the
    parabola through it and its two neighbours (`parabola_tip`) by at most `reach` of
    the step on either side; where a neighbour is missing or its cost not finite, the
    point itself."""
    ys = [cost(x) for x in grid]
    k = int(np.argmin(ys))
    if not (0 < k < len(grid) - 1 and np.all(np.isfinite(ys[k - 1:k + 2]))):
        return float(grid[k])
    tip = parabola_tip(grid[k - 1:k + 2], ys[k - 1:k + 2])
    return float(np.clip(tip, grid[k] - reach * (grid[k] - grid[k - 1]), grid[k] + reach * (grid[k + 1] - grid[k])))
