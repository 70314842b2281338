"""Scale: metres per SfM unit, by the method chosen. The windowed IMU solve (`scale`,
its least squares `lsq` and its tests of one scale `scale_checks`), the method's
dispatch and the per-part check (`scale_methods`), the visual-inertial bundle
adjustment's scale (`viba_scale`), marker and known distance (`marker`), the refusals
with their wording (`refusals`), and the benchmark's reference heuristic (`heuristic`)."""
