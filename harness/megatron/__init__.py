"""Megatron-LM as a source under test: fetched or checked out, loaded after a TE target, run on the CPU."""
