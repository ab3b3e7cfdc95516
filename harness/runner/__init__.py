"""Run cases over targets: pytest sessions with xdist workers, result records, sweeps."""
