"""The hard-world profiles of `packer synth` (`--effect`, `--profile`): which camera
effects and which motion a synthetic session gets. Plain data with no numpy or
OpenCV, so the CLI can offer the choices without importing the renderer
(`packer.synth.camera` draws them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

LENS_FOCAL = 1.03  # true focal / calib.txt's
LENS_PP = (1.0, -1.0)  # true principal point - calib.txt's, px
LENS_K1 = -0.10
LOW_TEXTURE_GRAIN = 3.0  # grey levels (std) of the plain surfaces' grain
EFFECTS = ("glove", "lens", "blur", "rolling-shutter", "exposure", "low-texture")


@dataclass(frozen=True)
class CameraEffects:
    """Which effects a session's frames get (all off: the ideal camera)."""

    glove: bool = False
    lens: bool = False
    blur: float = 0.0  # exposure time, s (0: sharp)
    rolling_shutter: float = 0.0  # readout time top to bottom row, s (0: global shutter)
    exposure: bool = False
    low_texture: float = 0.0  # grain std in grey levels on the plain surfaces (0: all textured)

    @property
    def any(self) -> bool:
        return self != CameraEffects()

    def describe(self) -> dict:
        d = asdict(self)
        if self.lens:
            d.update(lens_focal=LENS_FOCAL, lens_principal_point=list(LENS_PP), lens_k1=LENS_K1)
        return d

    @classmethod
    def from_names(cls, names: list[str] | tuple[str, ...]) -> CameraEffects:
        """`packer synth --effect NAME` values (EFFECTS) at the hard benchmark's levels."""
        bad = [n for n in names if n not in EFFECTS]
        if bad:
            raise ValueError(f"unknown camera effect(s) {', '.join(bad)} (known: {', '.join(EFFECTS)})")
        return cls(glove="glove" in names, lens="lens" in names, blur=0.008 if "blur" in names else 0.0,
                   rolling_shutter=0.020 if "rolling-shutter" in names else 0.0, exposure="exposure" in names,
                   low_texture=LOW_TEXTURE_GRAIN if "low-texture" in names else 0.0)


ALL_EFFECTS = CameraEffects.from_names(EFFECTS)
# the SLAM benchmark's profiles: (motion, effects)
PROFILES: dict[str, tuple[str, CameraEffects]] = {
    "easy": ("hand", CameraEffects()),
    "fast": ("fast", CameraEffects()),
    "glove": ("hand", CameraEffects(glove=True)),
    "lens": ("hand", CameraEffects(lens=True)),
    "blur-rs": ("hand", CameraEffects(blur=0.008, rolling_shutter=0.020)),
    "exposure": ("hand", CameraEffects(exposure=True)),
    "low-texture": ("hand", CameraEffects(low_texture=LOW_TEXTURE_GRAIN)),
    "all": ("fast", ALL_EFFECTS),
}
