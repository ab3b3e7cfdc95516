"""`repro run --refuse-device-calls`: the environment variable that carries it to the workers.
Set to 1, the CPU backend (cpu_backend/device.py) refuses, during each case, the CUDA calls of
the target's files, as a host without CUDA (an NPU host) would, instead of answering them, so a
bug an answer would hide shows. Loading the target and the autocast state are still answered.
A leaf module: the command line reads it without torch, the device without a cycle."""

REFUSE_ENV = "REPRO_REFUSE_DEVICE_CALLS"
