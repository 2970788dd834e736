"""rlkit's handmade code problems (problem, entry point, reference solution, assert tests)."""
