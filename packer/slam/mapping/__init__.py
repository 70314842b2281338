"""Mapping: the keyframes' structure from motion. COLMAP's database and verification,
GLOMAP or the incremental mapper, the camera (`colmap`); a long session in parts joined
on shared cameras (`chunks`); the links across the parts of a model that split
(`part_links`), places seen again (`revisits`), and keyframe rotations chained from
the tracks alone (`rotation_chain`)."""
