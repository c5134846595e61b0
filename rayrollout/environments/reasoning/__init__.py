"""reasoning-gym: procedurally generated reasoning tasks, scored by the package itself."""
