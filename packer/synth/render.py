"""A textured 3-D room rendered by vectorised ray casting.

Why a room of boxes and not a textured plane: a plane is a degenerate scene for
structure-from-motion (homography, no parallax); the pipeline must be tested on
real depth variation (0.5-3 m). Why procedural multi-scale texture: SIFT needs
thousands of distinctive corners per frame, and random (non-periodic) content keeps
matching unambiguous.

Scene = an axis-aligned room (camera inside, so every ray hits something) plus a
few axis-aligned boxes (a table block, objects on it, a crate on the floor). Every
face owns a patch of one texture atlas; a frame is: ray/box intersection in numpy,
per-pixel atlas coordinates, one `cv2.remap` (bilinear). Lambert shading is baked
into each face's patch because it is constant per face.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from packer.synth.photos import photo_texture

ROOM_TEXEL = 0.004  # m per texel on walls/floor/ceiling
OBJECT_TEXEL = 0.002  # finer on the nearby objects
_LIGHT = np.array([0.35, -0.45, 0.82])  # direction towards the light (world)
_PAD = 2  # texels between atlas patches (no bilinear bleeding)


@dataclass(frozen=True)
class Box:
    lo: np.ndarray  # (3,)
    hi: np.ndarray  # (3,)


@dataclass
class Scene:
    room: Box
    boxes: list[Box]
    atlas: np.ndarray  # (H, W, 3) uint8 RGB
    # per face f (room faces 0..5, then 6 per box): face 2k+s has normal axis k, s=0 lo / 1 hi
    axis_u: np.ndarray  # (F,) int: world axis mapped to atlas x
    axis_v: np.ndarray  # (F,) int: world axis mapped to atlas y
    lo_u: np.ndarray  # (F,) world coordinate at texel 0
    lo_v: np.ndarray
    u0: np.ndarray  # (F,) atlas origin of the patch
    v0: np.ndarray
    w: np.ndarray  # (F,) patch size in texels
    h: np.ndarray
    inv_texel: np.ndarray  # (F,)

    def describe(self) -> dict:
        return {
            "room": [self.room.lo.tolist(), self.room.hi.tolist()],
            "boxes": [[b.lo.tolist(), b.hi.tolist()] for b in self.boxes],
        }


def _texture(rng: np.random.Generator, h: int, w: int, texel: float) -> np.ndarray:
    """Multi-scale random texture (h, w, 3) uint8: value noise over five octaves plus
    random filled/outlined shapes and lines with sizes from 3 mm to 20 cm."""
    img = np.empty((h, w, 3), np.float32)
    img[:] = rng.uniform(70, 185, 3).astype(np.float32)
    for cell_m, amp in ((0.6, 35.0), (0.25, 30.0), (0.09, 28.0), (0.035, 24.0), (0.013, 18.0)):
        gh, gw = max(2, int(h * texel / cell_m) + 2), max(2, int(w * texel / cell_m) + 2)
        lum = rng.standard_normal((gh, gw)).astype(np.float32)
        col = rng.standard_normal((gh, gw, 3)).astype(np.float32) * 0.4
        g = lum[..., None] + col
        img += amp * cv2.resize(g, (w, h), interpolation=cv2.INTER_CUBIC)
    out = np.clip(img, 0, 255).astype(np.uint8)
    area = h * w * texel * texel  # m^2
    n = int(np.clip(area * 260, 12, 4000))
    sizes = np.exp(rng.uniform(np.log(0.004), np.log(0.09), n)) / texel  # texels
    kinds = rng.integers(0, 5, n)
    xs, ys = rng.uniform(0, w, n), rng.uniform(0, h, n)
    colors = rng.integers(0, 256, (n, 3))
    dark = rng.random(n) < 0.5  # half the shapes strongly dark or light: high contrast
    colors[dark] = colors[dark] // 4
    colors[~dark] = 150 + colors[~dark] * 105 // 255
    angles = rng.uniform(0, 180, n)
    aspect = rng.uniform(0.3, 1.0, n)
    thick = rng.integers(1, 4, n)
    for i in range(n):
        c = tuple(int(x) for x in colors[i])
        x, y, s = int(xs[i]), int(ys[i]), max(1, int(sizes[i]))
        k = kinds[i]
        if k == 0:
            cv2.circle(out, (x, y), s, c, -1, cv2.LINE_AA)
        elif k == 1:
            cv2.ellipse(out, (x, y), (s, max(1, int(s * aspect[i]))), float(angles[i]), 0, 360, c, -1, cv2.LINE_AA)
        elif k == 2:
            box = cv2.boxPoints(((float(x), float(y)), (2.0 * s, 2.0 * s * float(aspect[i])), float(angles[i])))
            cv2.fillConvexPoly(out, box.astype(np.int32), c, cv2.LINE_AA)
        elif k == 3:
            a = np.deg2rad(angles[i])
            dx, dy = int(2 * s * np.cos(a)), int(2 * s * np.sin(a))
            cv2.line(out, (x - dx, y - dy), (x + dx, y + dy), c, int(thick[i]), cv2.LINE_AA)
        else:
            cv2.ellipse(out, (x, y), (s, max(1, int(s * aspect[i]))), float(angles[i]), 0, 360, c, int(thick[i]),
                        cv2.LINE_AA)
    return out


def _plain(rng: np.random.Generator, h: int, w: int, grain: float) -> np.ndarray:
    """A plain surface (painted wall, table top): one colour, a faint low-frequency
    shading and a white grain of `grain` grey levels, the texture that gives a
    corner detector weak, slippery corners."""
    base = rng.uniform(90, 190) + rng.uniform(-12, 12, 3)
    gh, gw = max(2, h // 200 + 2), max(2, w // 200 + 2)
    shade = cv2.resize(rng.standard_normal((gh, gw)).astype(np.float32) * 4.0, (w, h), interpolation=cv2.INTER_CUBIC)
    img = base[None, None, :] + shade[..., None] + rng.normal(0.0, grain, (h, w, 1))
    return np.clip(img, 0, 255).astype(np.uint8)


# faces made plain by `plain_grain`: the left and the back wall, and the table block
_PLAIN_FACES = frozenset({0, 3} | set(range(6, 12)))


def make_scene(rng: np.random.Generator, scale: float = 1.0, plain_grain: float = 0.0, photos: bool = False) -> Scene:
    """A random room around the origin (camera starts near (0,0,0) looking +y):
    floor 0.8-1.0 m below, back wall 2-3 m ahead, a table block 0.5-1.3 m ahead with
    two or three objects on it and a crate on the floor. `scale` multiplies every
    length (the truth poses use the same scaled metres). `plain_grain` > 0 makes the
    table and two walls plain (`_plain`), the low-texture room; `photos`: every surface
    papered with real photographs (`packer.synth.photos`)."""
    floor = -rng.uniform(0.8, 1.0)
    room = Box(
        np.array([-rng.uniform(1.2, 1.6), -rng.uniform(0.8, 1.2), floor]),
        np.array([rng.uniform(1.2, 1.6), rng.uniform(2.0, 3.0), rng.uniform(1.0, 1.4)]),
    )
    t_top = floor + rng.uniform(0.4, 0.5)
    tx = rng.uniform(-0.15, 0.15)
    table = Box(np.array([tx - 0.6, rng.uniform(0.5, 0.6), floor]), np.array([tx + 0.6, rng.uniform(1.2, 1.4), t_top]))
    boxes = [table]
    for _ in range(int(rng.integers(2, 4))):
        sx, sy, sz = rng.uniform(0.08, 0.25), rng.uniform(0.08, 0.25), rng.uniform(0.06, 0.22)
        cx = rng.uniform(table.lo[0] + sx, table.hi[0] - sx)
        cy = rng.uniform(table.lo[1] + sy, table.hi[1] - sy)
        boxes.append(Box(np.array([cx - sx / 2, cy - sy / 2, t_top]), np.array([cx + sx / 2, cy + sy / 2, t_top + sz])))
    side = 1.0 if rng.random() < 0.5 else -1.0
    cx = side * rng.uniform(0.75, 1.0)
    boxes.append(Box(np.array([cx - 0.2, 1.0, floor]), np.array([cx + 0.2, 1.5, floor + rng.uniform(0.25, 0.4)])))
    if scale != 1.0:
        room = Box(room.lo * scale, room.hi * scale)
        boxes = [Box(b.lo * scale, b.hi * scale) for b in boxes]
    return _build_atlas(rng, room, boxes, scale, plain_grain, photos)


def _build_atlas(rng: np.random.Generator, room: Box, boxes: list[Box], scale: float,
                 plain_grain: float = 0.0, photos: bool = False) -> Scene:
    faces = []  # (axis_u, axis_v, lo_u, lo_v, w, h, texel, shade)
    for bi, b in enumerate([room] + boxes):
        texel = (ROOM_TEXEL if bi == 0 else OBJECT_TEXEL) * scale
        for k in range(3):
            au, av = [a for a in range(3) if a != k]
            w = int(np.ceil((b.hi[au] - b.lo[au]) / texel)) + 1
            h = int(np.ceil((b.hi[av] - b.lo[av]) / texel)) + 1
            for s in (0, 1):
                normal = np.zeros(3)
                # room faces are seen from inside (normal points inwards), boxes from outside
                normal[k] = (1.0 if s == 0 else -1.0) if bi == 0 else (-1.0 if s == 0 else 1.0)
                shade = 0.6 + 0.4 * max(0.0, float(normal @ _LIGHT) / np.linalg.norm(_LIGHT))
                faces.append((au, av, b.lo[au], b.lo[av], w, h, texel, shade))
    # shelf packing: widest patch sets the atlas width
    W = max(f[4] for f in faces) + 2 * _PAD
    u0s, v0s, x, y, row_h = [], [], _PAD, _PAD, 0
    for f in faces:
        if x + f[4] + _PAD > W:
            x, y, row_h = _PAD, y + row_h + _PAD, 0
        u0s.append(x)
        v0s.append(y)
        x += f[4] + _PAD
        row_h = max(row_h, f[5])
    H = y + row_h + _PAD
    atlas = np.zeros((H, W, 3), np.uint8)
    for i, (f, u0, v0) in enumerate(zip(faces, u0s, v0s)):
        if plain_grain > 0 and i in _PLAIN_FACES:
            tex = _plain(rng, f[5], f[4], plain_grain)
        elif photos:
            tex = photo_texture(rng, f[5], f[4], f[6])
        else:
            tex = _texture(rng, f[5], f[4], f[6] / scale)
        atlas[v0 : v0 + f[5], u0 : u0 + f[4]] = (tex.astype(np.float32) * f[7]).astype(np.uint8)
    arr = np.array([f[:8] for f in faces], dtype=np.float64)
    return Scene(
        room,
        boxes,
        atlas,
        arr[:, 0].astype(np.int64),
        arr[:, 1].astype(np.int64),
        arr[:, 2],
        arr[:, 3],
        np.array(u0s, np.float64),
        np.array(v0s, np.float64),
        arr[:, 4],
        arr[:, 5],
        1.0 / arr[:, 6],
    )


class Renderer:
    """Pinhole renderer for one scene; pixel rays are precomputed once."""

    def __init__(self, scene: Scene, width: int, height: int, fx: float, fy: float, cx: float, cy: float,
                 rays_cam: np.ndarray | None = None):
        self.scene, self.width, self.height = scene, width, height
        u, v = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
        # pixel centres: OpenCV convention, integer coordinates are pixel centres
        if rays_cam is None:  # a pinhole camera; a distorted lens passes its own rays (z = 1)
            rays_cam = np.stack([(u.ravel() - cx) / fx, (v.ravel() - cy) / fy, np.ones(u.size)])  # (3, N)
        self.rays_cam = rays_cam
        self._lo = np.stack([b.lo for b in scene.boxes])  # (B, 3)
        self._hi = np.stack([b.hi for b in scene.boxes])

    def render(self, pose: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 RGB image seen by a camera with camera-to-world `pose`."""
        return self.render_bands([(slice(0, self.height), pose)])

    def render_bands(self, bands: list[tuple[slice, np.ndarray]]) -> np.ndarray:
        """(H, W, 3) image whose row ranges are each seen from their own pose (a
        rolling shutter: rows exposed at different times)."""
        mx = np.empty(self.height * self.width, np.float32)
        my = np.empty_like(mx)
        for rows, pose in bands:
            sel = slice(rows.start * self.width, rows.stop * self.width)
            mx[sel], my[sel] = self._atlas_coords(pose, self.rays_cam[:, sel])
        return cv2.remap(self.scene.atlas, mx.reshape(self.height, self.width), my.reshape(self.height, self.width),
                         cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)

    def _atlas_coords(self, pose: np.ndarray, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Atlas (x, y) of the surface each ray (camera frame, (3, N)) hits."""
        sc = self.scene
        R, o = pose[:3, :3], pose[:3, 3]
        D = (R @ rays).astype(np.float32)  # (3, N)
        o32 = o.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.float32(1.0) / D
            # room: exit face along each axis, nearest of the three
            pos = D > 0
            bound = np.where(pos, sc.room.hi[:, None].astype(np.float32), sc.room.lo[:, None].astype(np.float32))
            tk = (bound - o32[:, None]) * inv
            tk[~np.isfinite(tk)] = np.inf
            k = np.argmin(tk, axis=0)
            idx = np.arange(D.shape[1])
            t = tk[k, idx]
            face = 2 * k + pos[k, idx]
            # boxes: slab test, keep the nearest positive entry
            for b in range(len(self._lo)):
                t1 = (self._lo[b][:, None].astype(np.float32) - o32[:, None]) * inv
                t2 = (self._hi[b][:, None].astype(np.float32) - o32[:, None]) * inv
                tmin = np.minimum(t1, t2)
                tnear = tmin.max(axis=0)
                tfar = np.maximum(t1, t2).min(axis=0)
                hit = (tnear <= tfar) & (tnear > 0) & (tnear < t)
                if not hit.any():
                    continue
                hi_idx = np.nonzero(hit)[0]
                kk = np.argmax(tmin[:, hi_idx], axis=0)
                t[hi_idx] = tnear[hi_idx]
                # entering through the lo face when moving +, the hi face when moving -
                face[hi_idx] = 6 + 6 * b + 2 * kk + (D[kk, hi_idx] < 0)
        P = o32[:, None] + t[None] * D  # (3, N) hit points
        au, av = sc.axis_u[face], sc.axis_v[face]
        pu = np.take_along_axis(P, au[None], 0)[0]
        pv = np.take_along_axis(P, av[None], 0)[0]
        it = sc.inv_texel[face].astype(np.float32)
        mu = np.clip((pu - sc.lo_u[face].astype(np.float32)) * it, 0, sc.w[face].astype(np.float32) - 1)
        mv = np.clip((pv - sc.lo_v[face].astype(np.float32)) * it, 0, sc.h[face].astype(np.float32) - 1)
        return mu + sc.u0[face].astype(np.float32), mv + sc.v0[face].astype(np.float32)

    def depth(self, pose: np.ndarray, uv: np.ndarray, fx: float, fy: float, cx: float, cy: float) -> np.ndarray:
        """(M,) z-depth in metres of the scene along the rays through OpenCV pixel
        coordinates `uv` (M,2) of a camera with camera-to-world `pose` (float64 ray
        casting, the same geometry as `render`)."""
        sc = self.scene
        uv = np.asarray(uv, dtype=np.float64).reshape(-1, 2)
        rays = np.stack([(uv[:, 0] - cx) / fx, (uv[:, 1] - cy) / fy, np.ones(len(uv))])  # z = 1: t is z-depth
        R, o = pose[:3, :3], pose[:3, 3]
        D = R @ rays
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / D
            bound = np.where(D > 0, sc.room.hi[:, None], sc.room.lo[:, None])
            tk = (bound - o[:, None]) * inv
            tk[~np.isfinite(tk)] = np.inf
            t = tk.min(axis=0)
            for lo, hi in zip(self._lo, self._hi):
                t1 = (lo[:, None] - o[:, None]) * inv
                t2 = (hi[:, None] - o[:, None]) * inv
                tnear = np.minimum(t1, t2).max(axis=0)
                tfar = np.maximum(t1, t2).min(axis=0)
                hit = (tnear <= tfar) & (tnear > 0) & (tnear < t)
                t = np.where(hit, tnear, t)
        return t
