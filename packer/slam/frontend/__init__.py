"""Front-end: what the images say before any model. KLT tracks through the video with
their keyframes and the mount's mask (`tracks`), and the rolling shutter taken out of
them, its readout measured against the gyro (`rolling`)."""
