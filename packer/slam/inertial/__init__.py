"""Inertial: the IMU against the images. Gyro alignment (camera-IMU rotation, clock
offset, bias: `imu_align`), its drift (`clock_drift`) and the offset without poses
(`visual_clock`), the accelerometer alone (`accel`), the gyro's rotations as two-view
priors (`gyro_prior`), the gyro-held bundle adjustment (`gyro_ba`), and the
visual-inertial bundle adjustment (`viba`) with its inputs (`viba_inputs`) and its
timing search (`viba_timing`)."""
