"""Device meshes and the logical-axis rules that place parameters, optimizer state and batches."""
