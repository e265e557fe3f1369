"""A run's resources, built once at the edge and handed down: :class:`~sluice.runtime.context.RunContext`."""
