"""What is tested: axes, the pipeline catalogue with references, presets, and the issue-22 oracle."""
