"""Running guirl across machines: the cluster file (`spec`), and the launchers (planned)."""
