"""Names shared by the emulator's modules (no imports, so `__init__` stays light)."""

DEVICE_TYPE = "neuron"
ENV_VAR = "ADAPTIVE_EAGER_NEURON_SIM"
LATENCY_ENV_VAR = "ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US"
ASYNC_ENV_VAR = "ADAPTIVE_EAGER_NEURON_SIM_ASYNC"
