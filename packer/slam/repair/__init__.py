"""Repair: the second try for a model refused for itself. Mapped again on the gyro's
rotations and the gyro calibrated from the images (`gyro_repair`), in parts when that
model splits, and scaled by the visual-inertial bundle adjustment (`repaired`)."""
