"""Run and check one case: the target's pipeline against the unfused reference."""
