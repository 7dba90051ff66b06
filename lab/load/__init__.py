"""Load generation: seeded workloads and the closed-loop concurrent-user driver."""
