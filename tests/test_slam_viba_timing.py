"""The clock offset and readout searches of the visual-inertial bundle adjustment
(`packer.slam.inertial.viba_timing`) on costs whose minimum is known. The search on real
renders: tests/test_slam_hard.py (every-effect seed 44, its repaired offset 8.8 ms off)."""
from __future__ import annotations

import numpy as np
import pytest

from packer.slam.inertial.viba_timing import READOUTS, best_timing, estimate_readout, parabola_tip, profile_min


def test_the_parabola_tip_is_the_vertex_and_stays_between_the_points():
    assert parabola_tip((0.0, 1.0, 2.0), (4.0, 1.0, 2.0)) == pytest.approx(1.25)  # y = 2 (x - 1.25)^2 + 0.875
    assert parabola_tip((0.0, 1.0, 2.0), (1.0, 0.0, 1.0)) == pytest.approx(1.0)
    assert parabola_tip((0.0, 1.0, 2.0), (1.0, 2.0, 0.0)) == 1.0  # not convex: the middle point
    assert parabola_tip((0.0, 1.0, 2.0), (100.0, 1.0, 0.99)) <= 2.0


@pytest.mark.parametrize("truth", [-0.0182, -0.004, 0.0, 0.0088, 0.0208])
def test_the_walk_finds_a_minimum_several_steps_away(truth: float):
    """Every-effect seeds 62, 44 and 5 started 18, 9 and 21 ms off: steps of 4 ms downhill."""
    calls: list[float] = []

    def cost(x: float) -> float:
        calls.append(x)
        return 1e4 * (x - truth) ** 2 + 3.0

    got = profile_min(cost, 0.0, 0.004, -0.03, 0.03)
    assert got == pytest.approx(truth, abs=1e-9)
    assert len(calls) <= 3 + int(abs(truth) / 0.004) + 2


def test_the_walk_stops_at_its_bound_and_a_cost_that_fails_everywhere_keeps_the_start():
    assert profile_min(lambda x: (x + 0.05) ** 2, 0.0, 0.004, -0.03, 0.03) == pytest.approx(-0.03)
    assert profile_min(lambda x: float("inf"), 0.001, 0.004, -0.03, 0.03) == 0.001


def test_a_cost_that_is_not_a_parabola_is_still_brought_within_a_step():
    """The IMU chi^2 of seed 44 against the offset rose faster on one side (0.42 at
    +8 ms, 0.77 at +12, 1.28 at +4): an asymmetric V."""
    def v(x: float) -> float:
        return 60 * (x - 0.0088) if x > 0.0088 else 200 * (0.0088 - x)

    assert abs(profile_min(v, 0.0, 0.004, -0.03, 0.03) - 0.0088) < 0.004


def test_offset_and_readout_are_found_together_and_a_known_readout_is_kept():
    truth = (0.0047, 0.020)

    def quick(readout: float, shift: float) -> tuple[float, float]:
        d, r = shift - truth[0], readout - truth[1]
        return 0.0, 1e4 * d * d + 1e3 * r * r + 50 * d * r + 7.0

    shift, readout = best_timing(quick, None, 0.03)
    assert shift == pytest.approx(truth[0], abs=3e-4)
    assert readout == pytest.approx(truth[1], abs=2e-3)
    shift, readout = best_timing(quick, 0.0, 0.03)
    assert readout == 0.0 and shift == pytest.approx(truth[0], abs=1e-3)


def test_a_failed_solve_costs_inf_and_is_walked_around():
    def quick(readout: float, shift: float) -> tuple[float, float]:
        if shift < -0.01:
            raise ValueError("indeterminate")
        return 0.0, (shift - 0.006) ** 2

    assert best_timing(quick, 0.0, 0.03)[0] == pytest.approx(0.006, abs=1e-9)


def test_the_readout_alone_is_refined_within_half_a_step_of_the_best_candidate():
    got = estimate_readout(lambda r: (r - 0.020) ** 2)
    assert got == pytest.approx(0.020, abs=1e-9)
    assert estimate_readout(lambda r: abs(r)) == 0.0
    far = estimate_readout(lambda r: {0.0: 3.0, 0.012: 1.0, 0.024: 1.01, 0.036: 5.0}[r])
    step = READOUTS[1] - READOUTS[0]
    assert 0.012 <= far <= 0.012 + step / 2 + 1e-12
    assert np.isfinite(far)


def test_best_lever_walks_each_axis_to_the_minimum_within_reach():
    """A cost like the adjustment's around the true lever arm (a quadratic with some
    coupling between the axes): from the windowed solve's estimate 6 mm off on one axis
    and 2-4 mm on the others, each axis is walked and its parabola taken; outside the
    reach it stops at the bound; a solve that fails costs inf and is walked around."""
    from packer.slam.inertial.viba_timing import best_lever

    true = np.array([-0.0547, -0.0020, 0.0017])
    H = np.array([[4.0, 0.5, 0.2], [0.5, 3.0, 0.3], [0.2, 0.3, 2.0]]) * 1e5

    def cost(r):
        d = np.asarray(r) - true
        return float(d @ H @ d) + 7.0

    start = true + np.array([-0.0003, 0.0025, -0.0066])
    found = best_lever(cost, start, reach=0.04)
    assert np.all(np.abs(found - true) < 0.001), found - true
    assert cost(found) < cost(start)
    bounded = best_lever(cost, true + np.array([0.0, 0.0, 0.05]), reach=0.02)
    assert abs(bounded[2] - (true[2] + 0.03)) < 1e-9  # stopped at the bound, 2 cm from where it started

    def fails_far(r):
        if abs(r[0] - true[0]) > 0.012:
            raise ValueError("indeterminate")
        return cost(r)

    assert np.all(np.abs(best_lever(fails_far, start, reach=0.04) - true) < 0.001)
