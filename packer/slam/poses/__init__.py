"""Poses: a pose and a flag for every frame from the scaled keyframes, the cubic
through them (`interpolate`) or, where the IMU was aligned, what it measured between
them (`imu_between`)."""
