"""The JAX engine: the Engine interface over the Llama math (engine/model/), with a slot-based
KV cache, the programs it compiles and the host-side state of its rows."""
