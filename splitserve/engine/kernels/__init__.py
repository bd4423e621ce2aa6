"""The engine's native kernels and what they run on: the C kernel behind jax.ffi (qkernel; its
sources in engine/native/, built into engine/_qmatmul*.so), the weight formats it multiplies
(quant), the CPU's features, and weights moved onto huge pages."""
