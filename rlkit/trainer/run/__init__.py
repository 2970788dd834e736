"""Running a training: the launch, the loop every trainer shares, the pre-flight, the worker layout, hangs and
worker deaths."""
