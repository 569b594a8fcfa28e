"""Model descriptions at the bottom of the stack: configs, families, presets, workloads, hardware."""
