"""A bundle adjustment whose rotations are the gyro's, calibrated from the images.

Why: a plain room with the glove over a quarter of the view leaves GLOMAP a few
keyframes 5-30 deg off, and the model is refused (its rotations disagree with the
gyro). The gyro measures every rotation to ~0.1 deg over seconds, given three
things it does not know: the camera-IMU rotation R_ic, its bias b, and the clock
offset (found by `align_imu`). Here the rotations are not free: keyframe k turns as

    R_wc,k = R_g(t_k; b) R_ic      (R_g: the gyro integrated from its first sample, bias b)

so one bad stretch of images cannot turn a keyframe, and R_ic and b are solved from
all the images at once (the window SfMs see 3 s of them and leave R_ic degrees off).
Unknowns: the camera centres c_k (the best-seen one fixed; the scale is free and kept at its
start's RMS), the points X_j, theta = (dR_ic, db) and the camera's focal length and
k1 (what GLOMAP got wrong with a lens 3% off calib.txt). Cost: Huber on the
reprojection error in pixels, plus weak priors on theta and the camera
(`GyroBaOptions`). Solved by Levenberg-Marquardt with the points eliminated (Schur
complement, 3x3 blocks): the reduced system is over 3K + 8 unknowns.

theta enters each keyframe as a body-frame turn phi_k = A_k theta (A_k 3x8 from
finite differences of R_g and R_ic); a point's camera coordinates p = R_wc^T (X - c)
move by [p]x phi. The camera parameters enter through the undistorted observations,
so their derivatives are finite differences too."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.slam.inertial.gyro_prior import undistorted_bearings
from packer.slam.inertial.imu_align import gyro_orientation
from packer.slam.inertial.viba_inputs import select_tracks
from packer.slam.rotations import so3_exp, so3_log

N_THETA = 8  # dR_ic (3), db (3), focal, k1


@dataclass
class GyroBaOptions:
    huber_px: float = 1.0  # beyond this an observation's weight falls off as 1/error
    outlier_px: float = 3.0  # observations further off after the first pass are dropped for the second
    rotation_prior: float = float(np.deg2rad(5.0))  # rad: the alignment's R_ic is this good or better
    bias_prior: float = 0.01  # rad/s
    focal_prior: float = 0.05  # share of the start's focal length (calib.txt is the app's nominal matrix)
    k1_prior: float = 0.05
    max_iterations: int = 100  # per pass (30: every-effect seeds 15 and 42 stopped short; with 100, 15 converged to a
    # right model, -0.47%, and 42 to a wrong one that the focal check refuses)
    max_points: int = 3000  # longest tracks first: the Schur complement's memory grows with points x keyframes


@dataclass
class Gyro:
    """The gyro on the frame clock: what R_g(t; b) needs."""

    t: np.ndarray  # IMU clock - offset (s)
    gyro: np.ndarray  # (N,3) rad/s
    times: np.ndarray  # (K,) keyframe times (frame clock)

    def rotations(self, R_ic: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """(K,3,3) camera-to-world rotations R_g(t_k; b) R_ic."""
        return gyro_orientation(self.t, self.gyro - bias, self.times) @ R_ic

    def jacobian(self, R_ic: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
        """(rotations (K,3,3), A (K,3,6)): each keyframe's body-frame turn per unit of (dR_ic, db)."""
        R0 = self.rotations(R_ic, bias)
        A = np.zeros((len(self.times), 3, 6))
        R0t = np.swapaxes(R0, -1, -2)
        for i in range(3):
            d = np.zeros(3)
            d[i] = eps
            A[:, :, i] = so3_log(R0t @ self.rotations(so3_exp(d[None])[0] @ R_ic, bias)) / eps
            A[:, :, 3 + i] = so3_log(R0t @ self.rotations(R_ic, bias + d)) / eps
        return R0, A


@dataclass
class Observations:
    cam: np.ndarray  # (n,) keyframe index
    point: np.ndarray  # (n,) point index
    xy: np.ndarray  # (n,2) pixels as tracked (rolling shutter already taken out)

    def subset(self, keep: np.ndarray) -> Observations:
        return Observations(self.cam[keep], self.point[keep], self.xy[keep])


@dataclass
class GyroBaResult:
    centres: np.ndarray  # (K,3) in the gyro's world (R_g's frame)
    R_wc: np.ndarray  # (K,3,3) R_g(t_k; b) R_ic
    points: np.ndarray  # (P,3)
    R_ic: np.ndarray
    gyro_bias: np.ndarray
    camera: list[float]  # [f, cx, cy, k1]
    inliers: float  # share of observations within outlier_px after the first pass
    rms_px: float  # RMS reprojection error of the inliers at the end
    iterations: int
    converged: bool  # the second pass stopped at a minimum, not at max_iterations
    obs: Observations  # what was adjusted: the observations of `points` (at most max_points), numbered as they are
    centre_std: np.ndarray  # (K,) each centre's marginal std (points, theta and the others free; the best-seen
    # centre and the scale held), over the centres' RMS distance from it: a keyframe the images barely place


def _sum_by(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """values (m, ...) summed into n bins by index (np.add.at, but through bincount)."""
    flat = values.reshape(len(values), -1)
    out = np.stack([np.bincount(index, weights=flat[:, c], minlength=n) for c in range(flat.shape[1])], axis=1)
    return out.reshape((n,) + values.shape[1:])


class _Problem:
    """The cost and its linearisation at one state (centres, points, theta)."""

    def __init__(self, gyro: Gyro, obs: Observations, camera: list[float], R_ic: np.ndarray, bias: np.ndarray,
                 opt: GyroBaOptions):
        self.gyro, self.obs, self.opt = gyro, obs, opt
        self.cx, self.cy = camera[1], camera[2]
        self.R_ic0, self.b0, self.f0, self.k10 = R_ic, bias, camera[0], camera[3]

    def residuals(self, c: np.ndarray, X: np.ndarray, R_wc: np.ndarray, f: float, k1: float
                  ) -> tuple[np.ndarray, np.ndarray]:
        """((n,2) pixel residuals, (n,3) camera coordinates)."""
        o = self.obs
        p = np.einsum("nji,nj->ni", R_wc[o.cam], X[o.point] - c[o.cam])
        z = np.where(np.abs(p[:, 2]) < 1e-9, 1e-9, p[:, 2])
        xn = undistorted_bearings(o.xy, [f, self.cx, self.cy, k1])
        return f * (p[:, :2] / z[:, None] - xn[:, :2]), p

    def cost(self, r: np.ndarray, p: np.ndarray, R_ic: np.ndarray, b: np.ndarray, f: float, k1: float) -> float:
        e = np.linalg.norm(r, axis=1)
        h = self.opt.huber_px
        rho = np.where(e <= h, 0.5 * e**2, h * (e - 0.5 * h))
        return float(np.sum(rho) + 1e6 * np.sum(p[:, 2] <= 0) + 0.5 * np.sum(self.prior(R_ic, b, f, k1) ** 2))

    def prior(self, R_ic: np.ndarray, b: np.ndarray, f: float, k1: float) -> np.ndarray:
        """(8,) whitened prior residuals of theta."""
        o = self.opt
        return np.concatenate([so3_log((R_ic @ self.R_ic0.T)[None])[0] / o.rotation_prior, (b - self.b0) / o.bias_prior,
                               [(f - self.f0) / (o.focal_prior * self.f0), (k1 - self.k10) / o.k1_prior]])

    def normal_equations(self, c, X, R_wc, A, f, k1, r, p):
        """(Hcc (K,3,3), Hct (K,3,8), Htt, gc, gt, Hpp (P,3,3), gp, per-observation Hcx (n,3,3), Htx (n,8,3))."""
        o, K, P = self.obs, len(c), len(X)
        w = _huber_weights(r, p, self.opt.huber_px)
        Jp, px = _projection_jacobians(p, f)
        JX = Jp @ np.swapaxes(R_wc, -1, -2)[o.cam]
        dcam = [(self.residuals(c, X, R_wc, f + 0.01, k1)[0] - r) / 0.01,
                (self.residuals(c, X, R_wc, f, k1 + 1e-5)[0] - r) / 1e-5]
        Jt = np.concatenate([Jp @ px @ A[o.cam], np.stack(dcam, axis=2)], axis=2)  # (n,2,8)
        Jc = -JX
        Hcc = _sum_by(o.cam, np.einsum("nai,naj->nij", Jc * w, Jc), K)
        Hct = _sum_by(o.cam, np.einsum("nai,naj->nij", Jc * w, Jt), K)
        gc = _sum_by(o.cam, np.einsum("nai,na->ni", Jc * w, r), K)
        Htt = np.einsum("nai,naj->ij", Jt * w, Jt)
        gt = np.einsum("nai,na->i", Jt * w, r)
        Hpp = _sum_by(o.point, np.einsum("nai,naj->nij", JX * w, JX), P)
        gp = _sum_by(o.point, np.einsum("nai,na->ni", JX * w, r), P)
        Hcx, Htx = np.einsum("nai,naj->nij", Jc * w, JX), np.einsum("nai,naj->nij", Jt * w, JX)
        return Hcc, Hct, Htt, gc, gt, Hpp, gp, Hcx, Htx


def _huber_weights(r: np.ndarray, p: np.ndarray, huber: float) -> np.ndarray:
    """(n,1,1) IRLS weights of the Huber kernel on the residual norms; 0 behind the camera."""
    e = np.linalg.norm(r, axis=1)
    return (np.where(e <= huber, 1.0, huber / np.maximum(e, 1e-12)) * (p[:, 2] > 0))[:, None, None]


def _projection_jacobians(p: np.ndarray, f: float) -> tuple[np.ndarray, np.ndarray]:
    """(d pixel / d p (n,2,3), [p]x (n,3,3)) at camera coordinates p: a body-frame
    turn phi of the camera moves p by [p]x phi."""
    z = np.where(np.abs(p[:, 2]) < 1e-9, 1e-9, p[:, 2])
    Jp = np.zeros((len(z), 2, 3))
    Jp[:, 0, 0] = Jp[:, 1, 1] = f / z
    Jp[:, 0, 2] = -f * p[:, 0] / z**2
    Jp[:, 1, 2] = -f * p[:, 1] / z**2
    px = np.zeros((len(z), 3, 3))
    px[:, 0, 1], px[:, 0, 2], px[:, 1, 0] = -p[:, 2], p[:, 1], p[:, 2]
    px[:, 1, 2], px[:, 2, 0], px[:, 2, 1] = -p[:, 0], -p[:, 1], p[:, 0]
    return Jp, px


def _reduced(prob: _Problem, lin, lam: float, K: int, P: int, prior_r: np.ndarray):
    """(S, rhs, Hpp^-1, Hyp, gp): the damped normal equations over y = [c (3K), theta (8)] with
    the points eliminated."""
    Hcc, Hct, Htt, gc, gt, Hpp, gp, Hcx, Htx = lin
    o = prob.obs
    ny = 3 * K + N_THETA
    W = np.diag(1.0 / np.array([prob.opt.rotation_prior] * 3 + [prob.opt.bias_prior] * 3
                               + [prob.opt.focal_prior * prob.f0, prob.opt.k1_prior]))
    Hyy = np.zeros((ny, ny))
    gy = np.zeros(ny)
    for k in range(K):
        Hyy[3 * k:3 * k + 3, 3 * k:3 * k + 3] = Hcc[k]
        Hyy[3 * k:3 * k + 3, 3 * K:] = Hct[k]
        Hyy[3 * K:, 3 * k:3 * k + 3] = Hct[k].T
    Hyy[3 * K:, 3 * K:] = Htt + W @ W
    gy[:3 * K] = gc.reshape(-1)
    gy[3 * K:] = gt + W @ prior_r
    # Hyp (P, ny, 3): each observation's camera block and its theta block, accumulated per point
    rows_c = (o.point * ny)[:, None] + 3 * o.cam[:, None] + np.arange(3)[None]
    rows_t = (o.point * ny)[:, None] + 3 * K + np.arange(N_THETA)[None]
    Hyp = _sum_by(np.concatenate([rows_c.reshape(-1), rows_t.reshape(-1)]),
                  np.concatenate([Hcx.reshape(-1, 3), Htx.reshape(-1, 3)]), P * ny).reshape(P, ny, 3)
    Hpp_d = Hpp + lam * np.einsum("nii->ni", Hpp)[:, :, None] * np.eye(3) + 1e-9 * np.eye(3)
    Hi = np.linalg.inv(Hpp_d)
    T = Hyp @ Hi  # (P, ny, 3)
    S = Hyy + lam * np.diag(np.diag(Hyy)) - np.transpose(T, (1, 0, 2)).reshape(ny, -1) @ np.transpose(
        Hyp, (1, 0, 2)).reshape(ny, -1).T
    rhs = -gy + np.einsum("pyi,pi->y", T, gp)
    return S, rhs, Hi, Hyp, gp


def _step(prob: _Problem, lin, lam: float, K: int, P: int, prior_r: np.ndarray, fixed: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(dy = [dc (3K), dtheta (8)] with dc_fixed = 0, dX (P,3)) of one damped Gauss-Newton step."""
    S, rhs, Hi, Hyp, gp = _reduced(prob, lin, lam, K, P, prior_r)
    ny = len(rhs)
    free = np.ones(ny, bool)
    free[3 * fixed:3 * fixed + 3] = False  # the gauge: one centre stays where it is
    S1 = S[np.ix_(free, free)]
    dy = np.zeros(ny)
    dy[free] = np.linalg.solve(S1 + 1e-9 * np.trace(S1) / len(S1) * np.eye(len(S1)), rhs[free])
    dX = -np.einsum("pij,pj->pi", Hi, gp + np.einsum("pyi,y->pi", Hyp, dy))
    return dy, dX


def _solve(gyro: Gyro, obs: Observations, c: np.ndarray, X: np.ndarray, camera: list[float], R_ic: np.ndarray,
           bias: np.ndarray, opt: GyroBaOptions, fixed: int) -> tuple:
    """One Levenberg-Marquardt run: (c, X, R_ic, b, f, k1, R_wc, residuals, camera coords, iterations, converged).
    Centre `fixed` is at the origin and stays there; the others' RMS distance from it is held."""
    prob = _Problem(gyro, obs, camera, R_ic, bias, opt)
    K, P = len(c), len(X)
    f, k1 = camera[0], camera[3]
    R_wc, A = gyro.jacobian(R_ic, bias)
    r, p = prob.residuals(c, X, R_wc, f, k1)
    E = prob.cost(r, p, R_ic, bias, f, k1)
    lam, it, done = 1e-3, 0, False
    rms0 = np.sqrt(np.mean(np.sum(c**2, axis=1)))
    while it < opt.max_iterations:
        it += 1
        lin = prob.normal_equations(c, X, R_wc, A, f, k1, r, p)
        prior_r = prob.prior(R_ic, bias, f, k1)
        for _ in range(10):
            dy, dX = _step(prob, lin, lam, K, P, prior_r, fixed)
            th = dy[3 * K:]
            c1, X1 = c + dy[:3 * K].reshape(K, 3), X + dX
            s = rms0 / max(np.sqrt(np.mean(np.sum(c1**2, axis=1))), 1e-12)  # the scale is free: hold it
            c1, X1 = c1 * s, X1 * s
            R_ic1, b1, f1, k11 = so3_exp(th[None, :3])[0] @ R_ic, bias + th[3:6], f + th[6], k1 + th[7]
            R1, A1 = gyro.jacobian(R_ic1, b1)
            r1, p1 = prob.residuals(c1, X1, R1, f1, k11)
            E1 = prob.cost(r1, p1, R_ic1, b1, f1, k11)
            if E1 < E:
                c, X, R_ic, bias, f, k1, R_wc, A, r, p = c1, X1, R_ic1, b1, f1, k11, R1, A1, r1, p1
                done = E - E1 < 1e-6 * E
                E, lam = E1, max(lam / 3, 1e-7)
                break
            lam *= 5
        else:
            done = True  # no step lowers the cost: a minimum
            break
        if done:
            break
    return c, X, R_ic, bias, f, k1, R_wc, r, p, it, done


def gyro_bundle_adjust(gyro: Gyro, obs: Observations, centres: np.ndarray, points: np.ndarray, camera: list[float],
                       R_ic: np.ndarray, bias: np.ndarray, opt: GyroBaOptions | None = None) -> GyroBaResult:
    """Two passes (the second without what the first left over `outlier_px`: a slid
    track, a corner on the glove) from a start in the gyro's world: `centres` (K,3)
    of the keyframes at `gyro.times`, `points` (P,3) seen through `obs`."""
    opt = opt or GyroBaOptions()
    obs, points = _longest(obs, points, opt.max_points)
    fixed = int(np.argmax(np.bincount(obs.cam, minlength=len(centres))))  # not keyframe 0: it may be the bad one
    c, X = np.asarray(centres, np.float64) - centres[fixed], np.asarray(points, np.float64) - centres[fixed]
    cam = [float(v) for v in camera] + [0.0] * (4 - len(camera))
    c, X, R_ic, bias, f, k1, _R, r, p, it1, _done = _solve(gyro, obs, c, X, cam, R_ic, bias, opt, fixed)
    keep = (np.linalg.norm(r, axis=1) <= opt.outlier_px) & (p[:, 2] > 0)
    cam = [f, cam[1], cam[2], k1]
    inl = obs.subset(keep)
    c, X, R_ic, bias, f, k1, R_wc, r, _p, it2, done = _solve(gyro, inl, c, X, cam, R_ic, bias, opt, fixed)
    std = _centre_std(gyro, inl, c, X, [f, cam[1], cam[2], k1], R_ic, bias, opt, fixed)
    return GyroBaResult(centres=c, R_wc=R_wc, points=X, R_ic=R_ic, gyro_bias=bias, camera=[f, cam[1], cam[2], k1],
                        inliers=float(np.mean(keep)), rms_px=float(np.sqrt(np.mean(np.sum(r**2, axis=1)))),
                        iterations=it1 + it2, converged=done, obs=obs, centre_std=std)


def _centre_std(gyro: Gyro, obs: Observations, c: np.ndarray, X: np.ndarray, camera: list[float], R_ic: np.ndarray,
                bias: np.ndarray, opt: GyroBaOptions, fixed: int) -> np.ndarray:
    """`GyroBaResult.centre_std`: the reduced system's inverse at the solution, its scale
    direction (every centre away from the fixed one, the points with them) held by a stiff
    constraint, as the free scale would otherwise make every far centre look uncertain."""
    prob = _Problem(gyro, obs, camera, R_ic, bias, opt)
    K, P = len(c), len(X)
    R_wc, A = gyro.jacobian(R_ic, bias)
    r, p = prob.residuals(c, X, R_wc, camera[0], camera[3])
    lin = prob.normal_equations(c, X, R_wc, A, camera[0], camera[3], r, p)
    S = _reduced(prob, lin, 0.0, K, P, np.zeros(N_THETA))[0]
    free = np.ones(len(S), bool)
    free[3 * fixed:3 * fixed + 3] = False
    v = np.concatenate([c.reshape(-1), np.zeros(N_THETA)])[free]
    S1 = S[np.ix_(free, free)]
    S1 = S1 + np.trace(S1) / len(S1) * np.outer(v, v) / max(float(v @ v), 1e-12)
    cov = np.linalg.inv(S1 + 1e-12 * np.trace(S1) / len(S1) * np.eye(len(S1)))
    var = np.zeros(3 * K)
    var[free[:3 * K]] = np.diag(cov)[:3 * K - 3]
    rms = np.sqrt(np.mean(np.sum(c**2, axis=1)))
    return np.sqrt(np.maximum(var.reshape(K, 3).sum(axis=1), 0.0)) / max(rms, 1e-12)


def _longest(obs: Observations, points: np.ndarray, max_points: int) -> tuple[Observations, np.ndarray]:
    """The `max_points` points seen most often (`viba_inputs.select_tracks`) and their
    observations, the points renumbered."""
    if len(points) <= max_points:
        return obs, points
    use = select_tracks(obs.cam, obs.point, np.ones(int(obs.cam.max()) + 1, bool), 1, max_points)
    kept = np.unique(obs.point[use])
    new = np.full(len(points), -1)
    new[kept] = np.arange(len(kept))
    return Observations(obs.cam[use], new[obs.point[use]], obs.xy[use]), points[kept]


def free_rotations(res: GyroBaResult, obs: Observations | None = None, iterations: int = 5) -> np.ndarray:
    """(K,3,3) each keyframe's rotation as its own images want it, with its centre and
    the points held where the adjustment put them: the check that the gyro's rotations
    were not forced on a wrong model (they are then pulled away, the gyro check sees it).
    `obs`: observations of `res.points` (default: those the adjustment used)."""
    obs = res.obs if obs is None else obs
    K, f = len(res.centres), res.camera[0]
    R = res.R_wc.copy()
    xn = undistorted_bearings(obs.xy, res.camera)[:, :2]
    for _ in range(iterations):
        p = np.einsum("nji,nj->ni", R[obs.cam], res.points[obs.point] - res.centres[obs.cam])
        z = np.where(np.abs(p[:, 2]) < 1e-9, 1e-9, p[:, 2])
        r = f * (p[:, :2] / z[:, None] - xn)
        w = _huber_weights(r, p, GyroBaOptions.huber_px)
        Jp, px = _projection_jacobians(p, f)
        J = Jp @ px
        H = _sum_by(obs.cam, np.einsum("nai,naj->nij", J * w, J), K) + 1e-9 * np.eye(3)
        g = _sum_by(obs.cam, np.einsum("nai,na->ni", J * w, r), K)
        R = R @ so3_exp(-np.linalg.solve(H, g[..., None])[..., 0])
    return R
