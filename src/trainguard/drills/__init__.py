"""Fire drills: inject one fault into a real run and show what trainguard caught."""
