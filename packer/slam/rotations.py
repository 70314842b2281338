"""SO(3) / Sim(3) helpers shared by the SLAM stage, vectorised over leading axes.

Kept here (not in each user) so interpolation, IMU alignment and the scale solve
agree on one convention: rotation vectors are axis * angle, `so3_exp(so3_log(R)) == R`,
quaternions are (w, x, y, z)."""
from __future__ import annotations

import numpy as np


def hat(v: np.ndarray) -> np.ndarray:
    """(..., 3) -> (..., 3, 3) skew-symmetric cross-product matrices."""
    v = np.asarray(v, dtype=np.float64)
    z = np.zeros(v.shape[:-1])
    x, y, w = v[..., 0], v[..., 1], v[..., 2]
    return np.stack(
        [np.stack([z, -w, y], -1), np.stack([w, z, -x], -1), np.stack([-y, x, z], -1)], -2
    )


def so3_exp(phi: np.ndarray) -> np.ndarray:
    """Rotation vectors (..., 3) -> rotation matrices (..., 3, 3) (Rodrigues)."""
    phi = np.asarray(phi, dtype=np.float64)
    th = np.linalg.norm(phi, axis=-1)[..., None, None]
    K = hat(phi)
    small = th < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 1.0 - th**2 / 6.0, np.sin(ths) / ths)
    b = np.where(small, 0.5 - th**2 / 24.0, (1.0 - np.cos(ths)) / ths**2)
    return np.eye(3) + a * K + b * (K @ K)


def so3_log(R: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) -> rotation vectors (..., 3), robust near 0 and pi."""
    q = quat_from_matrix(R)
    w = np.clip(q[..., 0], -1.0, 1.0)
    v = q[..., 1:]
    n = np.linalg.norm(v, axis=-1)
    th = 2.0 * np.arctan2(n, w)  # w >= 0 from quat_from_matrix, so th in [0, pi]
    small = n < 1e-12
    scale = np.where(small, 2.0 / np.where(np.abs(w) < 1e-12, 1.0, w), th / np.where(small, 1.0, n))
    return v * scale[..., None]


def quat_from_matrix(R: np.ndarray) -> np.ndarray:
    """(..., 3, 3) -> unit quaternions (..., 4) as (w, x, y, z) with w >= 0."""
    R = np.asarray(R, dtype=np.float64)
    m00, m11, m22 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    # Shepperd: pick the largest of 4 candidates for numerical stability.
    t = np.stack([m00 + m11 + m22, m00 - m11 - m22, -m00 + m11 - m22, -m00 - m11 + m22], -1)
    k = np.argmax(t, axis=-1)
    q = np.empty(R.shape[:-2] + (4,))
    r21, r12, r02, r20, r10, r01 = R[..., 2, 1], R[..., 1, 2], R[..., 0, 2], R[..., 2, 0], R[..., 1, 0], R[..., 0, 1]
    cand = [
        np.stack([1 + t[..., 0], r21 - r12, r02 - r20, r10 - r01], -1),
        np.stack([r21 - r12, 1 + t[..., 1], r01 + r10, r02 + r20], -1),
        np.stack([r02 - r20, r01 + r10, 1 + t[..., 2], r12 + r21], -1),
        np.stack([r10 - r01, r02 + r20, r12 + r21, 1 + t[..., 3]], -1),
    ]
    for i in range(4):
        sel = k == i
        q[sel] = cand[i][sel]
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return q * np.where(q[..., :1] < 0, -1.0, 1.0)


def matrix_from_quat(q: np.ndarray) -> np.ndarray:
    """(..., 4) (w, x, y, z) -> (..., 3, 3); the quaternion is normalised first."""
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def cumulative_rotations(steps: np.ndarray) -> np.ndarray:
    """(N,3,3) prefix products S_0 S_1 ... S_k of (N,3,3) rotations, by a log-depth
    scan (vectorised: a 10-minute 200 Hz recording is 17 batched matmuls)."""
    P = np.array(steps, dtype=np.float64)
    d = 1
    while d < len(P):
        P[d:] = P[:-d] @ P[d:]
        d *= 2
    return P


def rotation_mean(Rs: np.ndarray) -> np.ndarray:
    """Chordal L2 mean of (N,3,3) rotations: the rotation nearest their sum."""
    U, _S, Vt = np.linalg.svd(np.asarray(Rs, dtype=np.float64).sum(axis=0))
    return U @ np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt)) or 1.0]) @ Vt


def tangent_basis(u: np.ndarray) -> np.ndarray:
    """(3,2) orthonormal basis of the plane orthogonal to the unit vector u."""
    a = np.array([1.0, 0.0, 0.0]) if abs(u[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    e1 = np.cross(u, a)
    e1 /= np.linalg.norm(e1)
    return np.stack([e1, np.cross(u, e1)], axis=1)


def slerp(R0: np.ndarray, R1: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Geodesic interpolation R0 Exp(u Log(R0^T R1)) for u in [0, 1], broadcast over (...)."""
    d = so3_log(np.swapaxes(R0, -1, -2) @ R1)
    return R0 @ so3_exp(d * np.asarray(u, dtype=np.float64)[..., None])


def procrustes_rotation(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The rotation R minimising sum w_i |R a_i - b_i|^2 (orthogonal Procrustes / Kabsch,
    determinant forced to +1). a, b: (N, 3)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    w = np.ones(len(a)) if weights is None else np.asarray(weights, dtype=np.float64)
    H = (a * w[:, None]).T @ b  # sum w a b^T
    U, _S, Vt = np.linalg.svd(H)
    d = np.sign(np.linalg.det(Vt.T @ U.T)) or 1.0
    return Vt.T @ np.diag([1.0, 1.0, d]) @ U.T


def umeyama(src: np.ndarray, dst: np.ndarray, with_scale: bool = True) -> tuple[float, np.ndarray, np.ndarray]:
    """Similarity (s, R, t) minimising sum |s R src_i + t - dst_i|^2 (Umeyama 1991).
    src, dst: (N, 3), N >= 3 non-collinear points for a unique answer."""
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    xs, xd = src - mu_s, dst - mu_d
    var_s = float((xs**2).sum() / len(src))
    cov = xd.T @ xs / len(src)
    U, D, Vt = np.linalg.svd(cov)
    S = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        S[2, 2] = -1.0
    R = U @ S @ Vt
    s = float(np.trace(np.diag(D) @ S) / var_s) if with_scale and var_s > 0 else 1.0
    t = mu_d - s * R @ mu_s
    return s, R, t


def make_pose(R: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(..., 3, 3), (..., 3) -> (..., 4, 4) homogeneous transforms."""
    R = np.asarray(R, dtype=np.float64)
    T = np.zeros(R.shape[:-2] + (4, 4))
    T[..., :3, :3] = R
    T[..., :3, 3] = p
    T[..., 3, 3] = 1.0
    return T
