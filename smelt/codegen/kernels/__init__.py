"""The kernel library: C building blocks templates render with (activations and fused epilogues,
broadcast loop nests, ...). Nothing here is registered as an op; templates import from here,
never from each other."""
