"""Real test fixtures: OpenSSH server, dockerd, registry, test image, Ray ports (all on loopback)."""
