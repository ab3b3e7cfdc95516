"""What the user touches: the `repro` command line and the rendering of runs."""
