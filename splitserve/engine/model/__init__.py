"""The model: a Llama decoder's shape (LlamaConfig), its math in JAX, and its weights from a GGUF
file, a Hugging Face folder or random presets, in one canonical layout."""
